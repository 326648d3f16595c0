//! Settings read from `HIPOBJ_*` environment variables, once, at init.
//!
//! An unset or invalid value leaves the default; nothing here fails.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use crate::log::Level;
use crate::platform::GpuRuntime;

/// The library's settings (ABI spec, section 7; README).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `HIPOBJ_MAX_TRANSFERS`: connections in the pool, so transfers at once.
    pub max_transfers: u32,
    /// `HIPOBJ_STAGE_TIMEOUT_MS`: how long one staging copy may take.
    pub stage_timeout: Duration,
    /// `HIPOBJ_DMABUF`: try dma-buf registration for GPU memory.
    pub dmabuf: bool,
    /// `HIPOBJ_REQUIRE_GPU_DIRECT`: refuse the host-staged fallback.
    pub require_gpu_direct: bool,
    /// `HIPOBJ_RDMA_DEBUG`: report failed dma-buf exports, refused connect
    /// requests and failed transfers on stderr.
    pub rdma_debug: bool,
    /// `HIPOBJ_COMPLETION_TIMEOUT_MS`: how long a transfer waits, after the
    /// reply, for the server's final message.
    pub completion_timeout: Duration,
    /// `HIPOBJ_TOKEN_TIMEOUT_MS`: how long a token from
    /// `hipObjGetRdmaToken` keeps its connection reserved.
    pub token_timeout: Duration,
    /// `HIPOBJ_IDLE_TIMEOUT_MS`: how long an established connection may stay
    /// unused before it is closed.
    pub idle_timeout: Duration,
    /// `HIPOBJ_NIC_HINT`: the NIC hint used when `hipObjConfig_t.nicHint`
    /// is NULL (the original's later versions read it themselves).
    pub nic_hint: Option<String>,
    /// `HIPOBJ_GPU_RUNTIME`: `hip`, `cuda` or `auto` (any case).
    pub gpu_runtime: GpuRuntime,
    /// `HIPOBJ_LOG`: `error`, `warn`, `info` or `debug` (any case); unset
    /// or invalid: `debug` with `HIPOBJ_RDMA_DEBUG`, else `warn`.
    pub log: Level,
    /// `HIPOBJ_STATS`: one `hipobj-stats:` line on stderr at shutdown.
    pub stats: bool,
    /// `HIPOBJ_POLL_US`: how long a thread of the library polls for a
    /// transfer's next step before it sleeps (0 to 10000 µs; 0: it never
    /// polls). Unset: [`DEFAULT_POLL`] on a hardware NIC, none on a
    /// software one ([`poll_for`]).
    pub poll: Option<Duration>,
    /// `HIPOBJ_PROTOCOL`: the highest protocol version the client accepts
    /// from a server: 4 (final messages that invalidate the window), 3
    /// (striping) or 2 (as clients before them: for a server that
    /// mishandles a later version).
    pub protocol: u8,
    /// `HIPOBJ_STRIPES`: connections a large transfer moves over at most
    /// (1 to 8; 1 never stripes). Unset: [`DEFAULT_STRIPES`] on a hardware
    /// NIC, 1 on a software one ([`stripes_for`]).
    pub stripes: Option<usize>,
    /// `HIPOBJ_STRIPE_MIN`: the smallest transfer that is striped, in
    /// bytes (at least 64 KiB; 4 MiB by default).
    pub stripe_min: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_transfers: 16,
            stage_timeout: Duration::from_millis(30_000),
            dmabuf: true,
            require_gpu_direct: false,
            rdma_debug: false,
            completion_timeout: Duration::from_millis(5_000),
            token_timeout: Duration::from_millis(30_000),
            idle_timeout: Duration::from_millis(60_000),
            nic_hint: None,
            gpu_runtime: GpuRuntime::Auto,
            log: Level::Warn,
            stats: false,
            poll: None,
            protocol: crate::core::protocol::VERSION_4,
            stripes: None,
            stripe_min: DEFAULT_STRIPE_MIN,
        }
    }
}

/// Connections a large transfer moves over by default on a hardware NIC:
/// four, where one queue pair's cap (about 28 GB/s on a 400 Gb/s NIC)
/// gives way to the link's (ROCm's mori: gains plateau near eight queue
/// pairs, four by default for the NIC's resources).
pub const DEFAULT_STRIPES: usize = 4;
/// The smallest transfer striped by default: below it the other shares'
/// proofs (a round trip each, at once) cost more than one queue pair's cap
/// saves.
pub const DEFAULT_STRIPE_MIN: u64 = 4 << 20;
/// Lowest `HIPOBJ_STRIPE_MIN`.
pub const STRIPE_MIN_LOWEST: u64 = 64 << 10;

/// Whether the device is a software NIC (Soft-RoCE, siw), whose "device"
/// is the host's CPUs.
pub fn is_software(vendor_id: u32, name: &str) -> bool {
    /// Soft-RoCE's vendor id (0 before Linux 5.x) and siw's ("bmt").
    const SOFTWARE_VENDORS: [u32; 2] = [0x00ff_ffff, 0x0062_6d74];
    SOFTWARE_VENDORS.contains(&vendor_id) || name.starts_with("rxe") || name.starts_with("siw")
}

/// The stripes of a transfer on a device with this vendor id and name:
/// `setting`, else [`DEFAULT_STRIPES`], except on a software NIC, where
/// every queue pair is the same CPUs' work: 1.
pub fn stripes_for(setting: Option<usize>, vendor_id: u32, name: &str) -> usize {
    setting.unwrap_or(if is_software(vendor_id, name) {
        1
    } else {
        DEFAULT_STRIPES
    })
}

/// How long a server's dial (the CM connect to a client) may take by
/// default on a hardware NIC: a CM handshake takes milliseconds there, and a
/// client whose CM never answers fails its transfer this soon instead of
/// holding the server until the transfer's deadline.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a server's dial may take on a device with this vendor id and
/// name, within the transfer's deadline: `setting`, else
/// [`DEFAULT_CONNECT_TIMEOUT`], except on a software NIC, where `None`: the
/// transfer's deadline alone. There the CM's messages are packets that the
/// same CPUs handle behind the data of every transfer in flight: with 16
/// streams of 16 MiB READs on two emulated CPUs a dial took more than 2 s,
/// and the transfer failed while its client was still answering.
pub fn connect_timeout_for(
    setting: Option<Duration>,
    vendor_id: u32,
    name: &str,
) -> Option<Duration> {
    setting.or((!is_software(vendor_id, name)).then_some(DEFAULT_CONNECT_TIMEOUT))
}

/// How long a thread polls for a transfer's next step before it sleeps,
/// by default, on a hardware NIC: longer than a small transfer's round trip
/// and its data on a fast link (a 1 MiB WRITE takes about 20 to 40 µs at
/// 25 to 50 GB/s), far shorter than the S3 conversation around it.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);
/// Highest `HIPOBJ_POLL_US`.
pub const POLL_LIMIT_US: u64 = 10_000;

/// The poll on a device with this vendor id and name: `setting`, else
/// [`DEFAULT_POLL`], except on a software NIC (Soft-RoCE, siw), whose
/// "device" is the host's CPUs: a thread polling there takes the CPU the
/// NIC needs to make the step it polls for.
pub fn poll_for(setting: Option<Duration>, vendor_id: u32, name: &str) -> Duration {
    setting.unwrap_or(if is_software(vendor_id, name) {
        Duration::ZERO
    } else {
        DEFAULT_POLL
    })
}

/// Highest `HIPOBJ_MAX_TRANSFERS`.
pub const MAX_TRANSFERS_LIMIT: u32 = 1024;
/// Highest value of every `HIPOBJ_*_MS` variable: 24 hours.
pub const STAGE_TIMEOUT_LIMIT_MS: u64 = 86_400_000;

impl Options {
    /// Reads the process environment.
    pub fn from_env() -> Options {
        Options::from_lookup(|name| std::env::var_os(name))
    }

    /// Reads settings through `lookup`, which returns a variable's value.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Options {
        let defaults = Options::default();
        let value = |name: &str| lookup(name).map(|v| v.as_bytes().to_vec());
        let rdma_debug =
            value("HIPOBJ_RDMA_DEBUG").map_or(defaults.rdma_debug, |v| v.first() != Some(&b'0'));
        let log = value("HIPOBJ_LOG")
            .and_then(|v| Level::parse(&v))
            .unwrap_or(if rdma_debug {
                Level::Debug
            } else {
                defaults.log
            });
        Options {
            max_transfers: value("HIPOBJ_MAX_TRANSFERS")
                .and_then(|v| decimal_in(&v, 1, u64::from(MAX_TRANSFERS_LIMIT)))
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(defaults.max_transfers),
            stage_timeout: millis(value("HIPOBJ_STAGE_TIMEOUT_MS"), defaults.stage_timeout),
            dmabuf: value("HIPOBJ_DMABUF").map_or(defaults.dmabuf, |v| !starts_with_no(&v)),
            require_gpu_direct: value("HIPOBJ_REQUIRE_GPU_DIRECT")
                .map_or(defaults.require_gpu_direct, |v| !starts_with_no(&v)),
            // The debug messages are the debug level's.
            rdma_debug: log == Level::Debug,
            log,
            stats: value("HIPOBJ_STATS").is_some_and(|v| !starts_with_no(&v)),
            poll: value("HIPOBJ_POLL_US")
                .and_then(|v| decimal_in(&v, 0, POLL_LIMIT_US))
                .map(Duration::from_micros),
            protocol: value("HIPOBJ_PROTOCOL")
                .and_then(|v| decimal_in(&v, 2, 4))
                .and_then(|n| u8::try_from(n).ok())
                .unwrap_or(defaults.protocol),
            stripes: value("HIPOBJ_STRIPES")
                .and_then(|v| decimal_in(&v, 1, crate::core::protocol::MAX_STRIPES as u64))
                .and_then(|n| usize::try_from(n).ok()),
            stripe_min: value("HIPOBJ_STRIPE_MIN")
                .and_then(|v| decimal_in(&v, STRIPE_MIN_LOWEST, 1 << 40))
                .unwrap_or(defaults.stripe_min),
            completion_timeout: millis(
                value("HIPOBJ_COMPLETION_TIMEOUT_MS"),
                defaults.completion_timeout,
            ),
            token_timeout: millis(value("HIPOBJ_TOKEN_TIMEOUT_MS"), defaults.token_timeout),
            idle_timeout: millis(value("HIPOBJ_IDLE_TIMEOUT_MS"), defaults.idle_timeout),
            nic_hint: lookup("HIPOBJ_NIC_HINT")
                .and_then(|v| v.into_string().ok())
                .filter(|v| !v.trim().is_empty()),
            gpu_runtime: value("HIPOBJ_GPU_RUNTIME")
                .and_then(|v| runtime(&v))
                .unwrap_or(defaults.gpu_runtime),
        }
    }
}

/// `hip`, `cuda` or `auto`, in any case; anything else is no choice.
fn runtime(text: &[u8]) -> Option<GpuRuntime> {
    [
        (&b"auto"[..], GpuRuntime::Auto),
        (b"hip", GpuRuntime::Hip),
        (b"cuda", GpuRuntime::Cuda),
    ]
    .into_iter()
    .find(|(name, _)| text.eq_ignore_ascii_case(name))
    .map(|(_, runtime)| runtime)
}

/// A duration in milliseconds from 1 to 24 hours, else `default`.
fn millis(value: Option<Vec<u8>>, default: Duration) -> Duration {
    value
        .and_then(|v| decimal_in(&v, 1, STAGE_TIMEOUT_LIMIT_MS))
        .map_or(default, Duration::from_millis)
}

/// A value of plain decimal digits (no sign, space or other text) within
/// `lo..=hi`. Leading zeros are digits like any other.
fn decimal_in(text: &[u8], lo: u64, hi: u64) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = text.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    (lo..=hi).contains(&n).then_some(n)
}

/// The switch convention of the original: a value starting with `0`, `n` or
/// `N` means no. An empty value is set and starts with none of them.
fn starts_with_no(text: &[u8]) -> bool {
    matches!(text.first(), Some(b'0' | b'n' | b'N'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn with(vars: &[(&str, &str)]) -> Options {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Options::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn unset_gives_the_documented_defaults() {
        let o = with(&[]);
        assert_eq!(o.max_transfers, 16);
        assert_eq!(o.stage_timeout, Duration::from_secs(30));
        assert!(o.dmabuf);
        assert!(!o.require_gpu_direct);
        assert!(!o.rdma_debug);
    }

    #[test]
    fn striping_settings_take_their_ranges_and_default_by_device() {
        let o = |pairs: &[(&str, &str)]| with(pairs);
        assert_eq!(o(&[]).protocol, 4);
        assert_eq!(o(&[("HIPOBJ_PROTOCOL", "2")]).protocol, 2);
        assert_eq!(o(&[("HIPOBJ_PROTOCOL", "3")]).protocol, 3);
        for bad in ["1", "5", "x", ""] {
            assert_eq!(o(&[("HIPOBJ_PROTOCOL", bad)]).protocol, 4, "{bad}");
        }
        assert_eq!(o(&[("HIPOBJ_STRIPES", "8")]).stripes, Some(8));
        assert_eq!(o(&[("HIPOBJ_STRIPES", "1")]).stripes, Some(1));
        for bad in ["0", "9", "-1", "four"] {
            assert_eq!(o(&[("HIPOBJ_STRIPES", bad)]).stripes, None, "{bad}");
        }
        assert_eq!(o(&[]).stripe_min, 4 << 20);
        assert_eq!(o(&[("HIPOBJ_STRIPE_MIN", "65536")]).stripe_min, 65536);
        assert_eq!(o(&[("HIPOBJ_STRIPE_MIN", "65535")]).stripe_min, 4 << 20);
        assert_eq!(stripes_for(None, 0x1dd8, "ionic_0"), DEFAULT_STRIPES);
        assert_eq!(stripes_for(None, 0x00ff_ffff, "rxe0"), 1);
        assert_eq!(stripes_for(Some(4), 0, "rxe0"), 4);
    }

    #[test]
    fn a_servers_dial_may_take_2_s_on_hardware_and_the_transfers_deadline_on_software() {
        let two = Some(DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(two, Some(Duration::from_secs(2)));
        assert_eq!(connect_timeout_for(None, 0x02c9, "mlx5_0"), two);
        assert_eq!(connect_timeout_for(None, 0x1dd8, "ionic_0"), two);
        assert_eq!(connect_timeout_for(None, 0x00ff_ffff, "roce0"), None);
        assert_eq!(connect_timeout_for(None, 0, "rxe0"), None);
        assert_eq!(connect_timeout_for(None, 0x0062_6d74, "siw_eth0"), None);
        let set = Some(Duration::from_millis(75));
        assert_eq!(connect_timeout_for(set, 0, "rxe0"), set);
        assert_eq!(connect_timeout_for(set, 0x02c9, "mlx5_0"), set);
    }

    #[test]
    fn poll_takes_0_to_10000_microseconds_and_defaults_by_device() {
        let p = |v| with(&[("HIPOBJ_POLL_US", v)]).poll;
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(p("10000"), Some(Duration::from_millis(10)));
        for bad in ["", "10001", "-1", "5us", " 5"] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
        let unset = with(&[]);
        assert_eq!(poll_for(unset.poll, 0x02c9, "mlx5_0"), DEFAULT_POLL);
        assert_eq!(poll_for(unset.poll, 0x00ff_ffff, "roce0"), Duration::ZERO);
        assert_eq!(poll_for(unset.poll, 0, "rxe0"), Duration::ZERO);
        assert_eq!(
            poll_for(unset.poll, 0x0062_6d74, "siw_eth0"),
            Duration::ZERO
        );
        let set = with(&[("HIPOBJ_POLL_US", "7")]);
        assert_eq!(poll_for(set.poll, 0, "rxe0"), Duration::from_micros(7));
    }

    #[test]
    fn max_transfers_takes_1_to_1024_digits_only() {
        let m = |v| with(&[("HIPOBJ_MAX_TRANSFERS", v)]).max_transfers;
        assert_eq!(m("1"), 1);
        assert_eq!(m("1024"), 1024);
        assert_eq!(m("0064"), 64);
        for bad in [
            "0",
            "1025",
            "",
            " 8",
            "8 ",
            "+8",
            "-8",
            "8x",
            "0x10",
            "99999999999999999999999",
        ] {
            assert_eq!(m(bad), 16, "{bad:?}");
        }
    }

    #[test]
    fn stage_timeout_takes_1_to_a_day_in_ms() {
        let t = |v| with(&[("HIPOBJ_STAGE_TIMEOUT_MS", v)]).stage_timeout;
        assert_eq!(t("1"), Duration::from_millis(1));
        assert_eq!(t("86400000"), Duration::from_secs(86_400));
        for bad in ["0", "86400001", "1e3", "1.5", "", "-5", " 10"] {
            assert_eq!(t(bad), Duration::from_secs(30), "{bad:?}");
        }
    }

    #[test]
    fn log_level_and_stats() {
        let o = |vars: &[(&str, &str)]| {
            let o = with(vars);
            (o.log, o.rdma_debug, o.stats)
        };
        assert_eq!(o(&[]), (Level::Warn, false, false));
        assert_eq!(o(&[("HIPOBJ_LOG", "ERROR")]), (Level::Error, false, false));
        assert_eq!(o(&[("HIPOBJ_LOG", "info")]), (Level::Info, false, false));
        assert_eq!(o(&[("HIPOBJ_LOG", "debug")]), (Level::Debug, true, false));
        assert_eq!(
            o(&[("HIPOBJ_RDMA_DEBUG", "1")]),
            (Level::Debug, true, false)
        );
        assert_eq!(
            o(&[("HIPOBJ_RDMA_DEBUG", "1"), ("HIPOBJ_LOG", "warn")]),
            (Level::Warn, false, false),
            "HIPOBJ_LOG decides"
        );
        assert_eq!(
            o(&[("HIPOBJ_RDMA_DEBUG", "1"), ("HIPOBJ_LOG", "loud")]),
            (Level::Debug, true, false),
            "an invalid HIPOBJ_LOG leaves the default"
        );
        assert!(o(&[("HIPOBJ_STATS", "1")]).2);
        assert!(o(&[("HIPOBJ_STATS", "")]).2, "set, empty");
        assert!(!o(&[("HIPOBJ_STATS", "0")]).2);
        assert!(!o(&[("HIPOBJ_STATS", "no")]).2);
    }

    #[test]
    fn gpu_runtime_is_hip_cuda_or_auto_in_any_case() {
        let r = |v| with(&[("HIPOBJ_GPU_RUNTIME", v)]).gpu_runtime;
        assert_eq!(Options::default().gpu_runtime, GpuRuntime::Auto);
        assert_eq!(r("hip"), GpuRuntime::Hip);
        assert_eq!(r("HIP"), GpuRuntime::Hip);
        assert_eq!(r("cuda"), GpuRuntime::Cuda);
        assert_eq!(r("Cuda"), GpuRuntime::Cuda);
        assert_eq!(r("auto"), GpuRuntime::Auto);
        for bad in ["", "rocm", " cuda", "cuda ", "hipp", "nvidia"] {
            assert_eq!(r(bad), GpuRuntime::Auto, "{bad:?}");
        }
    }

    #[test]
    fn connection_timeouts_take_1_to_a_day_in_ms() {
        let o = with(&[
            ("HIPOBJ_COMPLETION_TIMEOUT_MS", "250"),
            ("HIPOBJ_TOKEN_TIMEOUT_MS", "86400000"),
            ("HIPOBJ_IDLE_TIMEOUT_MS", "0"),
        ]);
        assert_eq!(o.completion_timeout, Duration::from_millis(250));
        assert_eq!(o.token_timeout, Duration::from_secs(86_400));
        assert_eq!(o.idle_timeout, Duration::from_secs(60), "0 is out of range");
        let d = with(&[]);
        assert_eq!(d.completion_timeout, Duration::from_secs(5));
        assert_eq!(d.token_timeout, Duration::from_secs(30));
    }

    #[test]
    fn switches_follow_the_first_character() {
        let d = |v| with(&[("HIPOBJ_DMABUF", v)]).dmabuf;
        assert!(!d("0") && !d("no") && !d("N") && !d("nope"));
        assert!(d("1") && d("yes") && d("off") && d(""));
        let r = |v| with(&[("HIPOBJ_REQUIRE_GPU_DIRECT", v)]).require_gpu_direct;
        assert!(r("1") && r("yes") && r("true") && r(""));
        assert!(!r("0") && !r("n") && !r("No"));
        let g = |v| with(&[("HIPOBJ_RDMA_DEBUG", v)]).rdma_debug;
        assert!(g("1") && g("n") && g(""));
        assert!(!g("0") && !g("00"));
    }

    proptest! {
        #[test]
        fn any_value_gives_a_setting_within_range(v in proptest::collection::vec(any::<u8>(), 0..24)) {
            use std::os::unix::ffi::OsStringExt;
            let o = Options::from_lookup(|_| Some(OsString::from_vec(v.clone())));
            prop_assert!((1..=MAX_TRANSFERS_LIMIT).contains(&o.max_transfers));
            prop_assert!(o.stage_timeout >= Duration::from_millis(1));
            prop_assert!(o.stage_timeout <= Duration::from_millis(STAGE_TIMEOUT_LIMIT_MS));
        }
    }
}
