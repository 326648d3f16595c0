//! The library's one error type, and the frozen result codes it maps to.

/// The result codes of the C ABI (`hipObjOpError_t`). Values are frozen and
/// never reused; `capi` converts them to the C enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// `hipObjSuccess` (0)
    Success,
    /// `hipObjInvalidValue` (1)
    InvalidValue,
    /// `hipObjNotInitialized` (2)
    NotInitialized,
    /// `hipObjAlreadyInitialized` (3)
    AlreadyInitialized,
    /// `hipObjRdmaError` (4)
    Rdma,
    /// `hipObjS3Error` (5)
    S3,
    /// `hipObjBufNotRegistered` (6)
    BufNotRegistered,
    /// `hipObjBufAlreadyRegistered` (7)
    BufAlreadyRegistered,
    /// `hipObjNicNotFound` (8)
    NicNotFound,
    /// `hipObjDmabufNotSupported` (9)
    DmabufNotSupported,
    /// `hipObjSizeTooLarge` (10)
    SizeTooLarge,
    /// `hipObjInternalError` (11)
    Internal,
    /// `hipObjNotSupported` (12)
    NotSupported,
    /// `hipObjBusy` (13)
    Busy,
}

/// `hipErrorNoDevice`: the HIP code reported when no GPU can be used at all,
/// including when the HIP runtime library itself cannot be loaded.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;

/// Everything that can go wrong, grouped by what the caller can do about it.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    // ---- The caller passed something wrong: fix the call.
    /// An argument or configuration value breaks the contract of the call.
    #[error("invalid value: {0}")]
    InvalidValue(&'static str),
    /// A buffer is larger than the 4 GiB one registration may cover.
    #[error("size {0} exceeds the 4 GiB registration limit")]
    SizeTooLarge(u64),
    /// The address is not the exact base of a registered buffer.
    #[error("buffer not registered")]
    BufNotRegistered,
    /// The address is already the base of a registered buffer.
    #[error("buffer already registered")]
    BufAlreadyRegistered,

    // ---- The library is in the wrong state: retry later or in order.
    /// No instance: `hipObjInit` was not called, failed, or was undone.
    #[error("library not initialized")]
    NotInitialized,
    /// This process is a fork of the one whose instance it inherited: that
    /// instance's driver thread, connections and registrations belong to
    /// the parent and cannot be used here (`hipObjNotInitialized`).
    #[error(
        "this process ({child}) is a fork of the one that initialized the library ({parent}); \
         its instance belongs to the parent: initialize the library again in this process"
    )]
    Forked {
        /// The process that initialized the instance.
        parent: u32,
        /// This process.
        child: u32,
    },
    /// `hipObjInit` was called while an instance exists.
    #[error("library already initialized")]
    AlreadyInitialized,
    /// Something this call needs is held by another call or a running copy.
    #[error("busy: {0}")]
    Busy(&'static str),

    // ---- The machine cannot do it: fix the environment.
    /// A libibverbs or librdmacm call, or loading one of them, failed; the
    /// text names the call.
    #[error("RDMA: {0}")]
    Rdma(String),
    /// A HIP call failed; `code` is its `hipError_t`, `call` names it.
    #[error("HIP: {call} failed with hipError_t {code}")]
    Hip {
        /// The HIP function (or loading step) that failed.
        call: &'static str,
        /// The `hipError_t` it returned.
        code: i32,
    },
    /// The GPU runtime (HIP, or the CUDA driver) cannot be loaded, so no
    /// GPU can be used (reported with `hipErrorNoDevice`); the text says
    /// what was tried.
    #[error("GPU runtime unavailable: {0}")]
    HipMissing(String),
    /// No GPU can be served (`why`, with the runtime's `hipError_t`) and
    /// no NIC was named, so nothing says which NIC would serve host memory
    /// (`hipObjRdmaError`, as the original reports it).
    #[error(
        "no GPU ({why}) and no NIC named: to move host memory, pass nicHint or set \
         HIPOBJ_NIC_HINT to an RDMA device ({devices}; `hipobj doctor` shows what this host can do)"
    )]
    NoGpuNoNic {
        /// Why no GPU can be served.
        why: String,
        /// The runtime's `hipError_t`.
        code: i32,
        /// The RDMA devices present, said for the message.
        devices: String,
    },
    /// No RDMA device matched.
    #[error("no usable RDMA NIC: {0}")]
    NicNotFound(String),
    /// dma-buf registration was required and is not available.
    #[error("dma-buf registration not supported")]
    DmabufNotSupported,
    /// The operation is not available in this build or on this device.
    #[error("not supported: {0}")]
    NotSupported(&'static str),

    // ---- The S3 conversation failed: the application decides.
    /// A callback failed, or the server's reply was not a success.
    #[error("S3: {0}")]
    S3(String),

    /// A staging copy failed or outlived `HIPOBJ_STAGE_TIMEOUT_MS`; `hip` is
    /// the HIP error behind it, or 0 for a timeout.
    #[error("staging copy: {what} (hipError_t {hip})")]
    Staging {
        /// What failed.
        what: &'static str,
        /// The `hipError_t`, or 0.
        hip: i32,
    },

    // ---- A bug or an unrecoverable local failure.
    /// Staging copy failure or timeout, or a broken internal invariant.
    #[error("internal error: {0}")]
    Internal(String),
}

/// How the S3 error of a reply that is not a success begins
/// (`transfer::converse`): the server declined or failed the request.
pub(crate) const DECLINED: &str = "the server replied ";

impl Error {
    /// The status of a server reply that was not a success (the server
    /// declined or failed the transfer), for an error that is one.
    pub fn declined(&self) -> Option<u16> {
        match self {
            Error::S3(why) => {
                let status = why.strip_prefix(DECLINED)?;
                let end = status
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(status.len());
                status[..end].parse().ok()
            }
            _ => None,
        }
    }

    /// The frozen result code the C ABI reports for this error.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidValue(_) => Code::InvalidValue,
            Error::SizeTooLarge(_) => Code::SizeTooLarge,
            Error::BufNotRegistered => Code::BufNotRegistered,
            Error::BufAlreadyRegistered => Code::BufAlreadyRegistered,
            Error::NotInitialized | Error::Forked { .. } => Code::NotInitialized,
            Error::AlreadyInitialized => Code::AlreadyInitialized,
            Error::Busy(_) => Code::Busy,
            Error::Rdma(_)
            | Error::Hip { .. }
            | Error::HipMissing(_)
            | Error::NoGpuNoNic { .. } => Code::Rdma,
            Error::NicNotFound(_) => Code::NicNotFound,
            Error::DmabufNotSupported => Code::DmabufNotSupported,
            Error::NotSupported(_) => Code::NotSupported,
            Error::S3(_) => Code::S3,
            Error::Internal(_) | Error::Staging { .. } => Code::Internal,
        }
    }

    /// The `hipError_t` behind the failure, or 0 when HIP was not involved.
    pub fn hip_error(&self) -> i32 {
        match self {
            Error::Hip { code, .. } | Error::NoGpuNoNic { code, .. } => *code,
            Error::HipMissing(_) => HIP_ERROR_NO_DEVICE,
            Error::Staging { hip, .. } => *hip,
            _ => 0,
        }
    }

    /// Whether the error comes from the environment rather than from the
    /// caller's arguments: such errors are worth a line on stderr, since the
    /// code alone cannot say which library, device or call failed.
    pub fn is_environmental(&self) -> bool {
        matches!(
            self,
            Error::Rdma(_)
                | Error::Hip { .. }
                | Error::HipMissing(_)
                | Error::NoGpuNoNic { .. }
                | Error::NicNotFound(_)
                | Error::Internal(_)
                | Error::Staging { .. }
        )
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declined_reply_s_status_survives_the_cause_appended_to_it() {
        let plain = Error::S3(format!("{DECLINED}503"));
        assert_eq!(plain.declined(), Some(503));
        let caused = Error::S3(format!(
            "{DECLINED}500 (on this side: RDMA: a Bind completed with MwBindErr)"
        ));
        assert_eq!(caused.declined(), Some(500));
        assert_eq!(Error::S3("a callback failed".into()).declined(), None);
        assert_eq!(Error::S3(DECLINED.to_string()).declined(), None);
    }
}
