//! Fault injection and live-object counters shared by every fake.
//!
//! Each fake function starts with `faults.hit("ibv_reg_mr")?`-style checks
//! through [`Faults::check`]: the call is counted, appended to the log, and
//! failed when the plan says so. Plans name a function and its Nth call, or
//! the Nth call of any function (for sweeps: run an operation once to count
//! its calls, then fail each in turn).

use std::collections::HashMap;

use parking_lot::Mutex;

/// The fault plan and the record of calls.
#[derive(Default)]
pub struct Faults {
    state: Mutex<FaultState>,
}

#[derive(Default)]
struct FaultState {
    /// Calls per function since the last reset.
    calls: HashMap<&'static str, u64>,
    /// Calls of any function since the last reset.
    total: u64,
    /// (function, Nth call) to fail.
    nth: Vec<(&'static str, u64)>,
    /// Functions that always fail.
    always: Vec<&'static str>,
    /// Nth call of any function to fail.
    nth_overall: Vec<u64>,
    /// Every call, in order, since the last reset.
    log: Vec<&'static str>,
    /// Calls that were failed, in order.
    failed: Vec<&'static str>,
}

impl Faults {
    /// No plan, nothing counted.
    pub fn new() -> Faults {
        Faults::default()
    }

    /// Counts a call of `function` and says whether the plan fails it.
    pub fn check(&self, function: &'static str) -> bool {
        let mut s = self.state.lock();
        s.total += 1;
        let total = s.total;
        let n = {
            let count = s.calls.entry(function).or_insert(0);
            *count += 1;
            *count
        };
        s.log.push(function);
        let fail = s.always.contains(&function)
            || s.nth.iter().any(|&(f, k)| f == function && k == n)
            || s.nth_overall.contains(&total);
        if fail {
            s.failed.push(function);
        }
        fail
    }

    /// Fails the `n`th call (from 1, counted since the last reset) of
    /// `function`.
    pub fn fail_nth(&self, function: &'static str, n: u64) {
        self.state.lock().nth.push((function, n));
    }

    /// Fails every call of `function` until [`Faults::clear`].
    pub fn fail_always(&self, function: &'static str) {
        self.state.lock().always.push(function);
    }

    /// Fails the `n`th call (from 1) of any function since the last reset.
    pub fn fail_nth_overall(&self, n: u64) {
        self.state.lock().nth_overall.push(n);
    }

    /// Drops the plan; counts and logs stay.
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.nth.clear();
        s.always.clear();
        s.nth_overall.clear();
    }

    /// Drops the plan and zeroes the counts and logs.
    pub fn reset(&self) {
        *self.state.lock() = FaultState::default();
    }

    /// Calls of `function` since the last reset.
    pub fn calls(&self, function: &str) -> u64 {
        self.state.lock().calls.get(function).copied().unwrap_or(0)
    }

    /// Calls of any function since the last reset.
    pub fn total_calls(&self) -> u64 {
        self.state.lock().total
    }

    /// Every call since the last reset, in order.
    pub fn log(&self) -> Vec<&'static str> {
        self.state.lock().log.clone()
    }

    /// The calls the plan failed, in order.
    pub fn failed(&self) -> Vec<&'static str> {
        self.state.lock().failed.clone()
    }
}

/// Counters of live objects per kind ("qp", "mr", "pd"...), for leak checks,
/// and of destroys that failed.
#[derive(Default)]
pub struct Counters {
    live: Mutex<HashMap<&'static str, i64>>,
}

impl Counters {
    /// Zeroed counters.
    pub fn new() -> Counters {
        Counters::default()
    }

    /// One more live `kind`.
    pub fn created(&self, kind: &'static str) {
        *self.live.lock().entry(kind).or_insert(0) += 1;
    }

    /// One fewer live `kind`.
    pub fn destroyed(&self, kind: &'static str) {
        *self.live.lock().entry(kind).or_insert(0) -= 1;
    }

    /// Live objects of `kind`.
    pub fn live(&self, kind: &str) -> i64 {
        self.live.lock().get(kind).copied().unwrap_or(0)
    }

    /// Every kind with a non-zero count, sorted: empty when nothing leaked.
    pub fn snapshot(&self) -> Vec<(&'static str, i64)> {
        let mut all: Vec<_> = self
            .live
            .lock()
            .iter()
            .filter(|(_, n)| **n != 0)
            .map(|(k, n)| (*k, *n))
            .collect();
        all.sort();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_call_of_a_function_fails_once() {
        let f = Faults::new();
        f.fail_nth("ibv_reg_mr", 2);
        assert!(!f.check("ibv_reg_mr"));
        assert!(!f.check("ibv_create_qp"));
        assert!(f.check("ibv_reg_mr"));
        assert!(!f.check("ibv_reg_mr"));
        assert_eq!(f.calls("ibv_reg_mr"), 3);
        assert_eq!(f.failed(), vec!["ibv_reg_mr"]);
    }

    #[test]
    fn nth_overall_and_always() {
        let f = Faults::new();
        f.fail_nth_overall(3);
        f.fail_always("hipHostMalloc");
        assert!(!f.check("a"));
        assert!(f.check("hipHostMalloc"));
        assert!(f.check("b"));
        assert!(!f.check("c"));
        assert_eq!(f.total_calls(), 4);
        f.clear();
        assert!(!f.check("hipHostMalloc"));
        f.reset();
        assert_eq!(f.total_calls(), 0);
    }

    #[test]
    fn counters_report_leaks() {
        let c = Counters::new();
        c.created("qp");
        c.created("mr");
        c.destroyed("qp");
        assert_eq!(c.snapshot(), vec![("mr", 1)]);
        c.destroyed("mr");
        assert!(c.snapshot().is_empty());
    }
}
