//! `Options::from_lookup`: the `HIPOBJ_*` environment variables, whose
//! bytes the user sets. The input is their values, one per line, in the
//! order below (missing lines: unset; bytes need not be UTF-8). Whatever
//! they hold, every setting is within its documented bounds.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use hipobj::core::options::{Options, MAX_TRANSFERS_LIMIT, STAGE_TIMEOUT_LIMIT_MS};
use hipobj::platform::GpuRuntime;
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 10] = [
    "HIPOBJ_MAX_TRANSFERS",
    "HIPOBJ_STAGE_TIMEOUT_MS",
    "HIPOBJ_DMABUF",
    "HIPOBJ_REQUIRE_GPU_DIRECT",
    "HIPOBJ_RDMA_DEBUG",
    "HIPOBJ_COMPLETION_TIMEOUT_MS",
    "HIPOBJ_TOKEN_TIMEOUT_MS",
    "HIPOBJ_IDLE_TIMEOUT_MS",
    "HIPOBJ_NIC_HINT",
    "HIPOBJ_GPU_RUNTIME",
];

fuzz_target!(|data: &[u8]| {
    let values: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let lookup = |name: &str| {
        let at = NAMES.iter().position(|n| *n == name)?;
        values.get(at).map(|v| OsString::from_vec(v.to_vec()))
    };
    let options = Options::from_lookup(lookup);
    assert!((1..=MAX_TRANSFERS_LIMIT).contains(&options.max_transfers));
    let limit = Duration::from_millis(STAGE_TIMEOUT_LIMIT_MS);
    for d in [
        options.stage_timeout,
        options.completion_timeout,
        options.token_timeout,
        options.idle_timeout,
    ] {
        assert!(d >= Duration::from_millis(1) && d <= limit, "{d:?}");
    }
    if let Some(hint) = &options.nic_hint {
        assert!(!hint.trim().is_empty());
    }
    let runtime = values.get(9).map(|v| v.to_ascii_lowercase());
    let expected = match runtime.as_deref() {
        Some(b"hip") => GpuRuntime::Hip,
        Some(b"cuda") => GpuRuntime::Cuda,
        _ => GpuRuntime::Auto,
    };
    assert_eq!(options.gpu_runtime, expected);
    assert_eq!(Options::from_lookup(lookup), options);
});
