//! A connection's slot in the pool, as the connection's transitions see
//! it: what a thread leasing the slot learns ([`SlotInfo`]), and the narrow
//! interface ([`Slots`]) through which a transition returns its slot to
//! the free list or takes it off. The pool implements it; the connection
//! knows no pool, and the driver, which owns both, hands the one to the
//! other.

use std::sync::Arc;

use crate::platform::{Gid, Pd};

/// What a thread leasing a slot needs to know about it, as the driver left
/// it on the free list.
#[derive(Clone)]
pub struct SlotInfo {
    /// Index in the pool.
    pub index: usize,
    /// The lease's epoch: the driver ignores commands of another one.
    pub epoch: u64,
    /// The connection's name: its first QP's number, which tokens carry.
    pub qp_num: u32,
    /// The rkey the connection's memory window carries now, where the
    /// device has windows (the token's rkey is its index with a new key).
    pub window_rkey: Option<u32>,
    /// The server the connection is established with, if any.
    pub peer: Option<Gid>,
    /// The QP's protection domain (where a transfer registers its range on
    /// a device without windows).
    pub pd: Arc<dyn Pd>,
}

/// What a connection's transitions may do to the pool's free list (the
/// driver's thread only).
pub trait Slots {
    /// Puts a clean slot back, for the next lease.
    fn put_back(&self, info: SlotInfo);
    /// Takes up to `count` free slots for the shares of a striped transfer
    /// (for the primary at slot `primary`): those established with `peer`
    /// first, then those with no server; never one another server keeps
    /// (its next transfer would lose the connection).
    fn take_for_stripes(&self, count: usize, peer: Option<Gid>, primary: usize) -> Vec<SlotInfo>;
    /// Takes slot `index` off the free list if it is there (a free
    /// connection that was retired).
    fn take_free(&self, index: usize);
    /// Whether slot `index` is on the free list (not leased).
    fn is_free(&self, index: usize) -> bool;
    /// Replaces what the free list says of `info`'s slot, if it is there
    /// (a free connection that changed).
    fn refresh(&self, info: SlotInfo);
    /// Counts a connection that could not be reset.
    fn retire(&self);
}
