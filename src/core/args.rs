//! The argument rules of the C ABI that need no library state, in the order
//! the spec checks them. `capi` converts raw C values into these types; an
//! instance then checks what needs the buffer map.

use crate::error::{Error, Result};
use crate::platform::Access;

/// Largest registration: exactly 4 GiB is allowed.
pub const MAX_BUFFER_BYTES: u64 = 1 << 32;
/// Most buffers registered at once.
pub const MAX_BUFFERS: usize = 256;

/// A caller's buffer as `hipObjBufRegister` / `hipObjBufRegisterHost` see it:
/// not NULL, not empty, at most 4 GiB, not wrapping the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRange {
    /// First byte.
    pub addr: usize,
    /// Bytes, 1 to 4 GiB.
    pub len: usize,
}

impl BufferRange {
    /// Checks a registration's pointer and size.
    pub fn new(addr: usize, len: usize) -> Result<BufferRange> {
        if addr == 0 {
            return Err(Error::InvalidValue("buffer pointer is NULL"));
        }
        if len == 0 {
            return Err(Error::InvalidValue("buffer size is 0"));
        }
        let len64 = u64::try_from(len).map_err(|_| Error::SizeTooLarge(u64::MAX))?;
        if len64 > MAX_BUFFER_BYTES {
            return Err(Error::SizeTooLarge(len64));
        }
        // The last byte must be addressable: addr + len may equal 2^64 only
        // in the sense that addr + (len - 1) does not overflow.
        if addr.checked_add(len - 1).is_none() {
            return Err(Error::InvalidValue("buffer range wraps the address space"));
        }
        Ok(BufferRange { addr, len })
    }
}

/// The part of a registered buffer that one transfer or sync touches:
/// `offset` bytes into the registration, `len` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The registered base address the caller named.
    pub base: usize,
    /// Offset into the registration.
    pub offset: u64,
    /// Bytes, at least 1.
    pub len: u64,
}

impl Slice {
    /// Checks a transfer's pointer, size and offset (before the buffer lookup).
    pub fn new(base: usize, len: usize, offset: i64) -> Result<Slice> {
        if base == 0 {
            return Err(Error::InvalidValue("buffer pointer is NULL"));
        }
        if len == 0 {
            return Err(Error::InvalidValue("transfer size is 0"));
        }
        let offset =
            u64::try_from(offset).map_err(|_| Error::InvalidValue("offset is negative"))?;
        let len = u64::try_from(len).map_err(|_| Error::InvalidValue("transfer size too large"))?;
        Ok(Slice { base, offset, len })
    }

    /// Checks that `[offset, offset + len)` lies inside a registration of
    /// `registered` bytes, without computing a sum that could overflow.
    pub fn check_within(&self, registered: u64) -> Result<()> {
        match registered.checked_sub(self.offset) {
            Some(room) if self.len <= room => Ok(()),
            _ => Err(Error::InvalidValue(
                "range is not inside the registered buffer",
            )),
        }
    }
}

/// `hipObjBufSync`'s direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncDirection {
    /// `HIPOBJ_SYNC_TO_HOST` (0): device to staging buffer, before a PUT.
    ToHost,
    /// `HIPOBJ_SYNC_TO_DEVICE` (1): staging buffer to device, after a GET.
    ToDevice,
}

impl TryFrom<i32> for SyncDirection {
    type Error = Error;
    fn try_from(value: i32) -> Result<Self> {
        match value {
            0 => Ok(SyncDirection::ToHost),
            1 => Ok(SyncDirection::ToDevice),
            _ => Err(Error::InvalidValue("sync direction is not 0 or 1")),
        }
    }
}

/// A token's operation, from the server's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenOp {
    /// `HIPOBJ_RDMA_OP_PUT` (0): the server will RDMA READ the buffer.
    Put,
    /// `HIPOBJ_RDMA_OP_GET` (1): the server will RDMA WRITE the buffer.
    Get,
}

impl TryFrom<i32> for TokenOp {
    type Error = Error;
    fn try_from(value: i32) -> Result<Self> {
        match value {
            0 => Ok(TokenOp::Put),
            1 => Ok(TokenOp::Get),
            _ => Err(Error::InvalidValue("token op is not 0 or 1")),
        }
    }
}

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Object to buffer: the server RDMA WRITEs.
    Get,
    /// Buffer to object: the server RDMA READs.
    Put,
}

impl Direction {
    /// The remote access a transfer grants its server.
    pub fn access(self) -> Access {
        match self {
            Direction::Get => Access::REMOTE_WRITE,
            Direction::Put => Access::REMOTE_READ,
        }
    }
}

impl From<TokenOp> for Direction {
    fn from(op: TokenOp) -> Direction {
        match op {
            TokenOp::Get => Direction::Get,
            TokenOp::Put => Direction::Put,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn registration_rules_come_in_order() {
        assert_eq!(
            BufferRange::new(0, 0),
            Err(Error::InvalidValue("buffer pointer is NULL"))
        );
        assert_eq!(
            BufferRange::new(0x1000, 0),
            Err(Error::InvalidValue("buffer size is 0"))
        );
        assert_eq!(
            BufferRange::new(0x1000, (1 << 32) + 1),
            Err(Error::SizeTooLarge((1 << 32) + 1))
        );
        assert!(BufferRange::new(0x1000, 1 << 32).is_ok());
        assert_eq!(
            BufferRange::new(usize::MAX - 10, 12),
            Err(Error::InvalidValue("buffer range wraps the address space"))
        );
        assert!(BufferRange::new(usize::MAX - 10, 11).is_ok());
        // A too-large size wins over a wrap, as in the spec's order.
        assert_eq!(
            BufferRange::new(usize::MAX, usize::MAX).unwrap_err().code(),
            crate::error::Code::SizeTooLarge
        );
    }

    #[test]
    fn slice_rules() {
        assert!(Slice::new(0, 1, 0).is_err());
        assert!(Slice::new(8, 0, 0).is_err());
        assert_eq!(
            Slice::new(8, 1, -1),
            Err(Error::InvalidValue("offset is negative"))
        );
        let s = Slice::new(8, 16, 4096 - 16).unwrap();
        assert!(s.check_within(4096).is_ok());
        assert!(s.check_within(4095).is_err());
        let edge = Slice::new(8, usize::MAX, i64::MAX).unwrap();
        assert!(edge.check_within(u64::MAX).is_err());
        assert!(Slice::new(8, 1, 4096).unwrap().check_within(4096).is_err());
    }

    #[test]
    fn enums_accept_only_0_and_1() {
        assert_eq!(SyncDirection::try_from(0), Ok(SyncDirection::ToHost));
        assert_eq!(SyncDirection::try_from(1), Ok(SyncDirection::ToDevice));
        assert!(SyncDirection::try_from(2).is_err() && SyncDirection::try_from(-1).is_err());
        assert_eq!(TokenOp::try_from(0), Ok(TokenOp::Put));
        assert_eq!(TokenOp::try_from(1), Ok(TokenOp::Get));
        assert!(TokenOp::try_from(i32::MIN).is_err());
    }

    proptest! {
        #[test]
        fn within_matches_wide_arithmetic(reg in any::<u64>(), offset in any::<i64>(), len in 1usize..) {
            if let Ok(s) = Slice::new(1, len, offset) {
                let fits = u128::from(s.offset) + u128::from(s.len) <= u128::from(reg);
                prop_assert_eq!(s.check_within(reg).is_ok(), fits);
            }
        }
    }
}
