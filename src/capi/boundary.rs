//! The one way into the library from C.
//!
//! Every export's body is a single call to [`enter`], which runs the Rust
//! body, catches any panic so that none crosses into C, and turns the body's
//! value into the C return value through [`ReturnValue`].

use crate::log::{log, Level};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::types::{hipObjError_t, hipObjOpError_t};
use crate::core::{Code, Error};

/// A Rust result that an export returns to C.
pub(crate) trait ReturnValue {
    /// The C type.
    type C;
    /// The C value for this result; `call` names the export for logs.
    fn into_c(self, call: &'static str) -> Self::C;
    /// The C value returned when the body panicked.
    fn on_panic() -> Self::C;
}

/// Runs an export's body.
pub(crate) fn enter<R: ReturnValue>(call: &'static str, body: impl FnOnce() -> R) -> R::C {
    // AssertUnwindSafe: a panic abandons the call, and every structure the
    // body can reach is either local to it or behind a lock that does not
    // poison (parking_lot) and is left consistent between statements.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result.into_c(call),
        Err(_) => {
            log!(
                Level::Error,
                "{call}: internal panic caught at the C boundary"
            );
            R::on_panic()
        }
    }
}

/// The C enum value of a code.
pub(crate) fn op_error(code: Code) -> hipObjOpError_t {
    use hipObjOpError_t::*;
    match code {
        Code::Success => hipObjSuccess,
        Code::InvalidValue => hipObjInvalidValue,
        Code::NotInitialized => hipObjNotInitialized,
        Code::AlreadyInitialized => hipObjAlreadyInitialized,
        Code::Rdma => hipObjRdmaError,
        Code::S3 => hipObjS3Error,
        Code::BufNotRegistered => hipObjBufNotRegistered,
        Code::BufAlreadyRegistered => hipObjBufAlreadyRegistered,
        Code::NicNotFound => hipObjNicNotFound,
        Code::DmabufNotSupported => hipObjDmabufNotSupported,
        Code::SizeTooLarge => hipObjSizeTooLarge,
        Code::Internal => hipObjInternalError,
        Code::NotSupported => hipObjNotSupported,
        Code::Busy => hipObjBusy,
    }
}

impl ReturnValue for Result<(), Error> {
    type C = hipObjError_t;

    fn into_c(self, call: &'static str) -> hipObjError_t {
        match self {
            Ok(()) => hipObjError_t {
                opError: hipObjOpError_t::hipObjSuccess,
                hipError: 0,
            },
            Err(error) => {
                // The code alone cannot say which library, device or call
                // failed in the environment; argument errors stay quiet.
                if error.is_environmental() {
                    log!(Level::Error, "{call}: {error}");
                }
                hipObjError_t {
                    opError: op_error(error.code()),
                    hipError: error.hip_error(),
                }
            }
        }
    }

    fn on_panic() -> hipObjError_t {
        hipObjError_t {
            opError: hipObjOpError_t::hipObjInternalError,
            hipError: 0,
        }
    }
}

/// A static string returned by `hipObjGetErrorString`.
pub(crate) struct ErrorString(pub(crate) &'static CStr);

impl ReturnValue for ErrorString {
    type C = *const std::ffi::c_char;
    fn into_c(self, _: &'static str) -> Self::C {
        self.0.as_ptr()
    }
    fn on_panic() -> Self::C {
        c"Unknown error".as_ptr()
    }
}

/// A static string returned by `hipObjGetVersionString`.
pub(crate) struct VersionString(pub(crate) &'static CStr);

impl ReturnValue for VersionString {
    type C = *const std::ffi::c_char;
    fn into_c(self, _: &'static str) -> Self::C {
        self.0.as_ptr()
    }
    fn on_panic() -> Self::C {
        c"0.0.0".as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_internal_error_or_the_fallback_string() {
        let r = enter("test", || -> Result<(), Error> { panic!("boom") });
        assert_eq!(r.opError, hipObjOpError_t::hipObjInternalError);
        assert_eq!(r.hipError, 0);
        let s = enter("test", || -> ErrorString { panic!("boom") });
        // SAFETY: the fallback is a static NUL-terminated literal.
        assert_eq!(unsafe { CStr::from_ptr(s) }, c"Unknown error");
        let v = enter("test", || -> VersionString { panic!("boom") });
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(v) }, c"0.0.0");
    }

    #[test]
    fn errors_carry_their_code_and_hip_error() {
        let r = enter("test", || {
            Err(Error::Hip {
                call: "hipGetDevice",
                code: 101,
            })
        });
        assert_eq!(r.opError, hipObjOpError_t::hipObjRdmaError);
        assert_eq!(r.hipError, 101);
    }

    #[test]
    fn every_code_maps_to_the_enumerator_of_the_same_value() {
        let codes = [
            Code::Success,
            Code::InvalidValue,
            Code::NotInitialized,
            Code::AlreadyInitialized,
            Code::Rdma,
            Code::S3,
            Code::BufNotRegistered,
            Code::BufAlreadyRegistered,
            Code::NicNotFound,
            Code::DmabufNotSupported,
            Code::SizeTooLarge,
            Code::Internal,
            Code::NotSupported,
            Code::Busy,
        ];
        for (value, code) in codes.into_iter().enumerate() {
            assert_eq!(op_error(code) as usize, value);
        }
    }
}
