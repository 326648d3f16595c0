//! The application-driven GETs into staged buffers that `hipObjBufSync`
//! must wait for before it copies the staging buffer to the device.
//!
//! Only those are recorded: a PUT token or a GET into memory the NIC
//! writes itself needs nothing of a sync. A record goes when its job ends
//! (the driver tells the book, at once), so the book holds at most one
//! record per pool connection, and a failure is kept, one per buffer, for
//! the next sync of that buffer to report. No call scans the book: minting
//! adds a record, the driver removes it, a sync looks up one buffer.

use std::collections::HashMap;
use std::sync::Arc;

use super::mailbox::Mailbox;
use super::sync::Mutex;
use crate::error::{Error, Result};

/// A record's key: the slot and the lease epoch of its job (unique).
pub type JobKey = (usize, u64);

#[derive(Default, Debug)]
struct BufTokens {
    live: HashMap<JobKey, Arc<Mailbox>>,
    failed: Option<Error>,
}

/// The records, by the buffer's registered address.
#[derive(Default, Debug)]
pub struct TokenBook {
    bufs: Mutex<HashMap<usize, BufTokens>>,
}

impl TokenBook {
    /// An empty book.
    pub fn new() -> TokenBook {
        TokenBook::default()
    }

    /// Records a GET token into the staged buffer at `base`.
    pub fn add(&self, base: usize, key: JobKey, mailbox: Arc<Mailbox>) {
        self.bufs
            .lock()
            .entry(base)
            .or_default()
            .live
            .insert(key, mailbox);
    }

    /// The job `key` on the buffer at `base` ended with `outcome` (the
    /// driver, for every application-driven job it ends): its record goes,
    /// and a failure stays for the buffer's next sync.
    pub fn ended(&self, base: usize, key: JobKey, outcome: &Result<()>) {
        let mut bufs = self.bufs.lock();
        let Some(buf) = bufs.get_mut(&base) else {
            return;
        };
        if buf.live.remove(&key).is_none() {
            return;
        }
        if let Err(e) = outcome {
            buf.failed = Some(e.clone());
        }
        if buf.live.is_empty() && buf.failed.is_none() {
            bufs.remove(&base);
        }
    }

    /// The GETs into the buffer at `base` that are still running.
    pub fn live(&self, base: usize) -> Vec<Arc<Mailbox>> {
        self.bufs
            .lock()
            .get(&base)
            .map(|buf| buf.live.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Takes the failure of a GET into the buffer at `base` since the
    /// last time it was taken.
    pub fn take_failure(&self, base: usize) -> Option<Error> {
        let mut bufs = self.bufs.lock();
        let buf = bufs.get_mut(&base)?;
        let failed = buf.failed.take();
        if buf.live.is_empty() {
            bufs.remove(&base);
        }
        failed
    }

    /// Forgets the buffer at `base` (it was deregistered).
    pub fn forget(&self, base: usize) {
        self.bufs.lock().remove(&base);
    }

    /// Records held, live or failed (for tests).
    pub fn len(&self) -> usize {
        self.bufs
            .lock()
            .values()
            .map(|b| b.live.len() + usize::from(b.failed.is_some()))
            .sum()
    }

    /// Whether the book holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_goes_when_its_job_ends_and_a_failure_waits_for_one_sync() {
        let book = TokenBook::new();
        let (a, b) = (Arc::new(Mailbox::new()), Arc::new(Mailbox::new()));
        book.add(0x1000, (0, 1), a);
        book.add(0x1000, (1, 7), b);
        assert_eq!(book.live(0x1000).len(), 2);
        book.ended(0x1000, (0, 1), &Ok(()));
        assert_eq!(book.live(0x1000).len(), 1);
        book.ended(0x1000, (1, 7), &Err(Error::Rdma("lost".into())));
        assert!(book.live(0x1000).is_empty());
        assert_eq!(book.len(), 1);
        assert_eq!(book.take_failure(0x1000), Some(Error::Rdma("lost".into())));
        assert_eq!(book.take_failure(0x1000), None);
        assert!(book.is_empty());
        // An end the book never heard of changes nothing.
        book.ended(0x2000, (3, 3), &Err(Error::Rdma("x".into())));
        assert!(book.is_empty());
    }
}
