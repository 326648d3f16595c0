//! The fake fabric's only `unsafe`: moving bytes between registered memory
//! ranges of this process, as a NIC's DMA engine does.
//!
//! A [`Span`] is a range the fabric accepted at registration
//! (`Pd::reg_mr`, `Pd::reg_dmabuf_mr`). Registration is the registrant's
//! promise to a NIC that the memory stays mapped until the registration ends
//! and that nothing else touches it while a transfer into it may run; the
//! fabric copies only through registrations that are still live, under its
//! lock. That promise, not the type system, is what makes [`copy`] sound, as
//! it is for real hardware; this module exists only in the test fakes.

use std::ptr;

/// A range of this process's memory vouched for by a live registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    addr: usize,
    len: usize,
    /// Memory of a real GPU that the host cannot touch: bytes reach it
    /// only through the GPU runtime's copies ([`copy_via`]).
    device: bool,
}

impl Span {
    /// The range `[addr, addr + len)`, or `None` when it is empty, starts at
    /// address 0 or wraps around the address space.
    pub(crate) fn new(addr: usize, len: usize) -> Option<Span> {
        (addr != 0 && len != 0 && addr.checked_add(len).is_some()).then_some(Span {
            addr,
            len,
            device: false,
        })
    }

    /// As [`Span::new`], for memory of a real GPU.
    pub(crate) fn device(addr: usize, len: usize) -> Option<Span> {
        Span::new(addr, len).map(|span| Span {
            device: true,
            ..span
        })
    }
}

/// As [`copy`], except that a copy with a device span on either side is
/// handed to `runtime` (destination address, source address, length), as
/// the bounds allow, and its answer returned.
pub(crate) fn copy_via(
    runtime: &dyn Fn(usize, usize, usize) -> bool,
    dst: Span,
    dst_offset: usize,
    src: Span,
    src_offset: usize,
    len: usize,
) -> bool {
    if !(dst.device || src.device) {
        return copy(dst, dst_offset, src, src_offset, len);
    }
    let inside =
        |span: Span, offset: usize| offset.checked_add(len).is_some_and(|end| end <= span.len);
    if !inside(dst, dst_offset) || !inside(src, src_offset) {
        return false;
    }
    len == 0 || runtime(dst.addr + dst_offset, src.addr + src_offset, len)
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`;
/// the ranges may overlap (a QP may loop back into its own region). Returns
/// `false`, copying nothing, when either range does not lie inside its span.
pub(crate) fn copy(dst: Span, dst_offset: usize, src: Span, src_offset: usize, len: usize) -> bool {
    if dst.device || src.device {
        // The host cannot touch it; only `copy_via` can.
        return false;
    }
    let inside =
        |span: Span, offset: usize| offset.checked_add(len).is_some_and(|end| end <= span.len);
    if !inside(dst, dst_offset) || !inside(src, src_offset) {
        return false;
    }
    if len == 0 {
        return true;
    }
    // Cannot wrap: `Span::new` checked that `addr + span.len` does not, and
    // each offset + len is within its span.
    let from = ptr::with_exposed_provenance::<u8>(src.addr + src_offset);
    let to = ptr::with_exposed_provenance_mut::<u8>(dst.addr + dst_offset);
    // SAFETY: both ranges lie inside their spans (checked above). A span
    // exists only for a registration the fabric still holds (it drops or
    // fences off a span when the MR is deregistered, under the lock every
    // copy runs under), and the registrant guaranteed at `reg_mr` /
    // `reg_dmabuf_mr` that the memory is valid for reads and writes, with no
    // conflicting access, while registered — the same promise a NIC's DMA
    // relies on. `ptr::copy` allows the overlap.
    unsafe { ptr::copy(from, to, len) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_stays_inside_both_spans() {
        let mut a = vec![1u8; 16];
        let mut b = vec![0u8; 8];
        let sa = Span::new(a.as_mut_ptr() as usize, a.len()).expect("span");
        let sb = Span::new(b.as_mut_ptr() as usize, b.len()).expect("span");
        assert!(copy(sb, 2, sa, 10, 6));
        assert_eq!(b, [0, 0, 1, 1, 1, 1, 1, 1]);
        assert!(!copy(sb, 3, sa, 0, 6), "past the end of the destination");
        assert!(!copy(sb, 0, sa, 12, 6), "past the end of the source");
        assert!(copy(sb, 8, sa, 16, 0), "an empty copy at the very end");
        assert!(Span::new(0, 4).is_none());
        assert!(Span::new(usize::MAX, 2).is_none());
        assert!(Span::new(16, 0).is_none());
    }

    #[test]
    fn device_spans_are_copied_only_through_the_runtime() {
        let mut host = vec![5u8; 16];
        let sh = Span::new(host.as_mut_ptr() as usize, host.len()).expect("span");
        // An address the host must never touch.
        let sd = Span::device(0x1000, 64).expect("span");
        assert!(!copy(sd, 0, sh, 0, 8), "never by the host");
        let seen = std::cell::Cell::new(None);
        let runtime = |dst: usize, src: usize, len: usize| {
            seen.set(Some((dst, src, len)));
            true
        };
        assert!(copy_via(&runtime, sd, 8, sh, 4, 12));
        assert_eq!(seen.get(), Some((0x1008, host.as_ptr() as usize + 4, 12)));
        seen.set(None);
        assert!(
            !copy_via(&runtime, sd, 60, sh, 0, 8),
            "past the device span"
        );
        assert_eq!(seen.get(), None, "refused before the runtime");
        assert!(copy_via(&runtime, sh, 0, sh, 8, 8), "host to host is plain");
        assert_eq!(seen.get(), None);
        assert_eq!(host[0], 5);
    }
}
