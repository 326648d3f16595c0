//! Models of what transfer threads and the connection driver share, run by
//! loom under `--cfg loom` (`scripts/loom.sh`), which runs each closure
//! under every interleaving of its threads (up to its preemption bound)
//! and fails on a deadlock (a lost wake-up is one), a panic or a leak.
//!
//! The connection state machines themselves have one owner, the driver
//! thread, and nothing to interleave; these are the meeting points around
//! them: the free list (leases, the driver putting slots back, closing and
//! a dead driver waking waiters), a transfer's mailbox, and the command
//! queue (a command is either refused or answered, even as the driver
//! dies).

use std::sync::Arc;

use loom::thread;

use super::commands::{Command, Commands};
use super::pool::Pool;
use super::slots::{SlotInfo, Slots};
use crate::core::mailbox::Mailbox;
use crate::error::Error;
use crate::platform::Pd;
use crate::testing::fabric::{DeviceSpec, Fabric};
use crate::testing::{Counters, Faults};

/// A PD of a fake device: what a slot carries (made once, outside the
/// models, which only pass it around).
fn pd() -> Arc<dyn Pd> {
    let fabric = Fabric::new(Arc::new(Faults::new()), Arc::new(Counters::new()));
    fabric
        .add_device(DeviceSpec::new("d0", std::net::Ipv4Addr::new(192, 0, 2, 9)))
        .expect("a fake device");
    let ctx = fabric.verbs(&["d0"]).open("d0").expect("its context");
    ctx.alloc_pd().expect("a PD")
}

fn slot(index: usize, pd: &Arc<dyn Pd>) -> SlotInfo {
    SlotInfo {
        index,
        epoch: 1,
        qp_num: 0x100 + u32::try_from(index).expect("a small index"),
        window_rkey: None,
        peer: None,
        pd: pd.clone(),
    }
}

/// The driver's part: answers `releases` Release commands by putting their
/// slot back, as it does once a slot is clean.
fn drive(commands: &Commands, pool: &Pool, pd: &Arc<dyn Pd>, releases: usize) {
    let mut done = 0;
    while done < releases {
        for command in commands.take() {
            match command {
                Command::Release { index, .. } => {
                    pool.put_back(slot(index, pd));
                    done += 1;
                }
                _ => panic!("only releases are sent here"),
            }
        }
        if done < releases {
            thread::yield_now();
        }
    }
}

#[test]
fn two_threads_share_one_slot_that_the_driver_puts_back() {
    let pd = pd();
    loom::model(move || {
        let commands = Arc::new(Commands::new().expect("the command queue"));
        let pool = Arc::new(Pool::new(1, commands.clone()));
        pool.put_back(slot(0, &pd));
        let leasers: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                thread::spawn(move || {
                    let lease = pool.acquire().expect("the slot, now or once it is back");
                    assert_eq!(lease.info().index, 0);
                    // Dropped unarmed: a Release for the driver.
                })
            })
            .collect();
        drive(&commands, &pool, &pd, 2);
        for leaser in leasers {
            leaser.join().expect("a leaser");
        }
        assert_eq!(pool.free_count(), 1, "the slot is back, once");
    });
}

#[test]
fn closing_the_pool_wakes_a_thread_waiting_for_a_slot() {
    loom::model(|| {
        let commands = Arc::new(Commands::new().expect("the command queue"));
        let pool = Arc::new(Pool::new(1, commands));
        let waiter = {
            let pool = pool.clone();
            thread::spawn(move || pool.acquire().err())
        };
        pool.close();
        let got = waiter.join().expect("the waiter");
        assert_eq!(got, Some(Error::NotInitialized));
    });
}

#[test]
fn a_dead_driver_wakes_a_thread_waiting_for_a_slot_with_its_error() {
    let pd = pd();
    loom::model(move || {
        let commands = Arc::new(Commands::new().expect("the command queue"));
        let pool = Arc::new(Pool::new(2, commands));
        pool.put_back(slot(0, &pd));
        let why = Error::Rdma("the driver stopped".into());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                thread::spawn(move || {
                    let lease = pool.acquire();
                    // One may get the slot before the death; keep it so
                    // that the other must wait or see the death.
                    let got = lease.as_ref().err().cloned();
                    if let Ok(mut lease) = lease {
                        lease.settle();
                    }
                    got
                })
            })
            .collect();
        pool.kill(why.clone());
        let got: Vec<Option<Error>> = waiters
            .into_iter()
            .map(|w| w.join().expect("a waiter"))
            .collect();
        assert!(
            got.iter().all(|g| g.is_none() || g.as_ref() == Some(&why)),
            "{got:?}"
        );
        assert!(
            got.iter().any(Option::is_some),
            "two threads, one slot: {got:?}"
        );
        assert_eq!(pool.acquire().err(), Some(why));
    });
}

#[test]
fn a_mailbox_is_filled_once_and_every_waiter_sees_that_outcome() {
    loom::model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let fillers: Vec<_> = [Ok(()), Err(Error::Rdma("late".into()))]
            .into_iter()
            .map(|outcome| {
                let mailbox = mailbox.clone();
                thread::spawn(move || mailbox.fill(outcome))
            })
            .collect();
        let waiter = {
            let mailbox = mailbox.clone();
            thread::spawn(move || mailbox.wait(None))
        };
        let seen = mailbox.wait(None);
        for filler in fillers {
            filler.join().expect("a filler");
        }
        assert!(seen.is_some());
        assert_eq!(waiter.join().expect("the waiter"), seen);
        assert_eq!(mailbox.peek(), seen, "the first fill stays");
    });
}

#[test]
fn a_command_sent_as_the_driver_dies_is_refused_or_answered() {
    loom::model(|| {
        let commands = Arc::new(Commands::new().expect("the command queue"));
        let done = Arc::new(Mailbox::new());
        let sender = {
            let (commands, done) = (commands.clone(), done.clone());
            thread::spawn(move || {
                commands
                    .send(Command::EndTokens { base: 0, done }, false)
                    .is_ok()
            })
        };
        commands.kill(&Error::Rdma("the driver stopped".into()));
        let queued = sender.join().expect("the sender");
        assert!(
            commands.take().is_empty(),
            "nothing is queued after the death"
        );
        assert_eq!(
            done.peek().is_some(),
            queued,
            "a queued command is answered"
        );
    });
}
