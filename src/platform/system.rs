//! The production platform: libibverbs, librdmacm and HIP, loaded on first
//! use, and the topology read from `/sys`.
//!
//! An application that never calls `hipObjInit` never loads any of them.
//! A successful load is kept for the rest of the process; a failed one is
//! tried again at the next init, so installing a missing package does not
//! need a restart.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::cm::{self, LoadedCm};
use super::gpu::{self, LoadedHip};
use super::topology::SysfsTopology;
use super::verbs::{self, LoadedVerbs};
use super::{Cm, Gpu, Platform, Topology, Verbs};
use crate::core::Result;

/// The production platform.
#[derive(Default)]
pub struct SystemPlatform {
    verbs: Mutex<Option<Arc<LoadedVerbs>>>,
    cm: Mutex<Option<Arc<LoadedCm>>>,
    hip: Mutex<Option<Arc<LoadedHip>>>,
}

/// Returns `Some(cached)` or loads with `open` and caches a success.
fn load_once<T>(slot: &Mutex<Option<Arc<T>>>, open: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
    let mut slot = slot.lock();
    if let Some(loaded) = slot.as_ref() {
        return Ok(loaded.clone());
    }
    let loaded = Arc::new(open()?);
    *slot = Some(loaded.clone());
    Ok(loaded)
}

impl Platform for SystemPlatform {
    fn verbs(&self) -> Result<Arc<dyn Verbs>> {
        let loaded = load_once(&self.verbs, || LoadedVerbs::open(verbs::loader::SONAMES))?;
        Ok(loaded)
    }

    fn cm(&self) -> Result<Arc<dyn Cm>> {
        let loaded = load_once(&self.cm, || LoadedCm::open(cm::SONAMES))?;
        Ok(loaded)
    }

    fn topology(&self) -> Result<Arc<dyn Topology>> {
        Ok(Arc::new(SysfsTopology::system()))
    }

    fn gpu(&self) -> Result<Arc<dyn Gpu>> {
        let loaded = load_once(&self.hip, || LoadedHip::open(gpu::loader::SONAMES))?;
        Ok(loaded)
    }
}

/// The process's one production platform, never destroyed.
pub fn system() -> Arc<dyn Platform> {
    static SYSTEM: OnceLock<Arc<SystemPlatform>> = OnceLock::new();
    SYSTEM
        .get_or_init(|| Arc::new(SystemPlatform::default()))
        .clone()
}
