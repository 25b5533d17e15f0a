//! The independent-thread-scheduling (ITS) warp mode: a seeded, adversarial,
//! deterministic scheduler for the lanes of one emulated block.
//!
//! On Volta and later GPUs the lanes of a warp diverge and reconverge freely:
//! `activemask` returns whichever lanes happen to execute that instruction
//! together, a `*.sync` collective meets exactly the lanes named in its mask,
//! and naming a lane that does not arrive is undefined behaviour. This mode
//! makes the CPU backend at least that adversarial:
//!
//! * every thread of the block is an OS thread, but **one runs at a time**: a
//!   token passes between them at *scheduling points* (every atomic operation,
//!   every back-off or spin, every warp collective), and a seeded random
//!   number generator picks who runs next. The run is a function of the seed,
//!   so a failing schedule replays from it;
//! * [`active_mask`](super::super::warp::active_mask) forms a *group* per call
//!   site: the first lane to arrive draws a target size from the seed (a lone
//!   lane, all live lanes, or anything between) and waits for that many lanes
//!   of its warp to reach the same call site; a group also closes when no
//!   other thread can run or after a bounded number of scheduling steps, so
//!   lanes that took another path never hold it up. The lanes of the group
//!   get the group as their mask;
//! * a collective (`ballot`, `shfl`, `match_any`, `sync_warp`) waits for
//!   exactly the lanes of its mask (same operation, same mask) and returns
//!   only their values;
//! * a collective whose mask does not contain the calling lane, names a lane
//!   that has exited, or names a lane that does not arrive (every thread of
//!   the block blocked: a deadlock; a missing lane that ran more than
//!   [`LANE_TURNS`] turns of its own without arriving: a livelock; or a
//!   meeting open for more than [`MEETING_STEPS`] scheduling steps of the
//!   whole block) is an **error**: the kernel fails with a message that
//!   names the operation, its call site, the warp and the lanes (and the
//!   seed), never a silent hang.
//!
//! Scheduling points are cheap when no ITS launch runs: one relaxed load of
//! a process-wide counter.

use core::sync::atomic::{AtomicUsize, Ordering};
use std::format;
use std::panic::Location;
use std::string::String;
use std::sync::{Mutex, MutexGuard};
use std::thread::Thread;
use std::vec::Vec;

/// ITS blocks running in this process (the fast path of [`preempt`]).
pub(super) static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Turns (times it was given the token) a lane named by an open collective
/// may run without arriving before the launch fails: the livelock bound of
/// a lane that spins instead of arriving. Counted per missing lane, so the
/// bound does not shrink as the block grows (a 1,024-thread block shares
/// its steps among 1,024 threads; a leader doing bounded work, such as
/// [`FINAL_SCANS`](crate::heap::slab::FINAL_SCANS) searches
/// under contention, must not be mistaken for a livelock).
pub const LANE_TURNS: u64 = 200_000;

/// Scheduling steps of the whole block an open collective may wait for its
/// lanes before the launch fails (the safety net for a missing lane that
/// waits elsewhere while other threads spin).
pub const MEETING_STEPS: u64 = 50_000_000;

/// Scheduling steps an `active_mask` group waits for more lanes before it
/// closes with the lanes it has.
const GROUP_STEPS: u64 = 256;

/// One-in-`PREEMPT_ODDS` atomics hand the token to another thread.
const PREEMPT_ODDS: u64 = 3;

const NONE: u32 = u32::MAX;

/// The warp operations the scheduler knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `activemask`.
    ActiveMask,
    /// `vote.sync.ballot`.
    Ballot,
    /// `shfl.sync.idx`.
    Shfl,
    /// `match.any.sync`.
    MatchAny,
    /// `bar.warp.sync`.
    SyncWarp,
    /// `bar.sync` (the whole block).
    SyncThreads,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Runnable,
    Blocked,
    Exited,
}

struct Slot {
    status: Status,
    /// Times this thread was given the token.
    turns: u64,
    thread: Option<Thread>,
    values: [u64; 32],
    mask: u32,
}

struct Meeting {
    op: Op,
    warp: u32,
    /// The collective's mask; for `ActiveMask`, the lanes gathered so far.
    mask: u32,
    /// `ActiveMask`: the group size drawn at creation.
    target: u32,
    site: &'static Location<'static>,
    arrived: u32,
    values: [u64; 32],
    since: u64,
    /// The turns of each lane of the warp when the meeting opened.
    turns0: [u64; 32],
}

struct Sched {
    rng: u64,
    running: u32,
    steps: u64,
    slots: Vec<Slot>,
    meetings: Vec<Meeting>,
    /// Threads waiting at `sync_threads`.
    barrier: Vec<u32>,
    error: Option<String>,
}

/// The scheduler of one emulated block in ITS mode.
pub struct ItsBlock {
    sched: Mutex<Sched>,
    block_idx: u32,
    seed: u64,
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Sched {
    fn live_lanes(&self, warp: u32) -> u32 {
        let mut m = 0;
        for l in 0..32 {
            let t = (warp * 32 + l) as usize;
            if t < self.slots.len() && self.slots[t].status != Status::Exited {
                m |= 1 << l;
            }
        }
        m
    }

    fn exited_lanes(&self, warp: u32) -> u32 {
        let mut m = 0;
        for l in 0..32 {
            let t = (warp * 32 + l) as usize;
            if t >= self.slots.len() || self.slots[t].status == Status::Exited {
                m |= 1 << l;
            }
        }
        m
    }

    /// Hands the lanes of meeting `i` their results and makes them runnable.
    fn complete(&mut self, i: usize) {
        let mt = self.meetings.swap_remove(i);
        let part = mt.arrived;
        for l in 0..32 {
            if part & (1 << l) != 0 {
                let s = &mut self.slots[(mt.warp * 32 + l) as usize];
                s.values = mt.values;
                s.mask = part;
                if s.status == Status::Blocked {
                    s.status = Status::Runnable;
                }
            }
        }
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
        for s in &mut self.slots {
            if s.status == Status::Blocked {
                s.status = Status::Runnable;
            }
        }
        self.meetings.clear();
        self.barrier.clear();
    }

    /// Picks the next thread to run (another one than `me` when `leave`
    /// and another can run), closing overdue or blocking `active_mask`
    /// groups and detecting deadlocks. Returns the thread to unpark.
    fn switch(&mut self, me: u32, leave: bool, block_idx: u32, seed: u64) -> Option<Thread> {
        self.steps += 1;
        // Overdue groups close with the lanes they have; overdue
        // collectives are a failure.
        let mut i = 0;
        while i < self.meetings.len() {
            let age = self.steps - self.meetings[i].since;
            if self.meetings[i].op == Op::ActiveMask && age > GROUP_STEPS {
                self.complete(i);
            } else if self.meetings[i].op != Op::ActiveMask && (age > MEETING_STEPS || self.lane_spun(i)) {
                let msg = self.describe(i, block_idx, seed, "did not arrive within the scheduling bound");
                self.fail(msg);
                break;
            } else {
                i += 1;
            }
        }
        loop {
            let runnable: Vec<u32> = (0..self.slots.len() as u32)
                .filter(|&t| self.slots[t as usize].status == Status::Runnable && !(leave && t == me))
                .collect();
            let runnable = if runnable.is_empty() && leave && self.slots[me as usize].status == Status::Runnable {
                std::vec![me]
            } else {
                runnable
            };
            if !runnable.is_empty() {
                let next = runnable[(splitmix(&mut self.rng) % runnable.len() as u64) as usize];
                self.running = next;
                self.slots[next as usize].turns += 1;
                return if next == me { None } else { self.slots[next as usize].thread.clone() };
            }
            // Nobody can run: close the oldest forming group, else it is a
            // deadlock (or everyone exited).
            let oldest = (0..self.meetings.len())
                .filter(|&i| self.meetings[i].op == Op::ActiveMask)
                .min_by_key(|&i| self.meetings[i].since);
            if let Some(i) = oldest {
                self.complete(i);
                continue;
            }
            if self.slots.iter().all(|s| s.status == Status::Exited) {
                self.running = NONE;
                return None;
            }
            let msg = if !self.meetings.is_empty() {
                self.describe(0, block_idx, seed, "did not arrive (deadlock: every thread of the block is waiting)")
            } else {
                format!(
                    "independent-thread-scheduling emulation (seed {seed:#x}), block {block_idx}: sync_threads \
                     deadlock: {} thread(s) wait at the barrier, the others wait in warp collectives",
                    self.barrier.len()
                )
            };
            self.fail(msg);
        }
    }

    /// Whether a lane that meeting `i` waits for ran more than
    /// [`LANE_TURNS`] turns since the meeting opened.
    fn lane_spun(&self, i: usize) -> bool {
        let mt = &self.meetings[i];
        let missing = mt.mask & !mt.arrived;
        (0..32u32).filter(|l| missing & (1 << l) != 0).any(|l| {
            let t = (mt.warp * 32 + l) as usize;
            t < self.slots.len() && self.slots[t].turns - mt.turns0[l as usize] > LANE_TURNS
        })
    }

    /// The turns of each lane of `warp` now.
    fn warp_turns(&self, warp: u32) -> [u64; 32] {
        let mut t = [0; 32];
        for (l, x) in t.iter_mut().enumerate() {
            if let Some(s) = self.slots.get(warp as usize * 32 + l) {
                *x = s.turns;
            }
        }
        t
    }

    fn describe(&self, i: usize, block_idx: u32, seed: u64, what: &str) -> String {
        let mt = &self.meetings[i];
        let missing = mt.mask & !mt.arrived;
        let exited = missing & self.exited_lanes(mt.warp);
        format!(
            "independent-thread-scheduling emulation (seed {seed:#x}), block {block_idx} warp {}: {:?} at {} \
             with mask {:#010x}: lane(s) {:#010x} arrived, lane(s) {:#010x} {what}{}",
            mt.warp,
            mt.op,
            mt.site,
            mt.mask,
            mt.arrived,
            missing,
            if exited != 0 { format!(" (exited: {exited:#010x})") } else { String::new() }
        )
    }
}

impl ItsBlock {
    /// The scheduler of block `block_idx` with `threads` threads, whose
    /// schedule is a function of `seed`.
    pub fn new(block_idx: u32, threads: u32, seed: u64) -> Self {
        let slots = (0..threads)
            .map(|_| Slot { status: Status::Runnable, turns: 0, thread: None, values: [0; 32], mask: 0 })
            .collect();
        let mut rng = seed ^ (block_idx as u64).wrapping_mul(0xA24B_AED4_963E_E407);
        splitmix(&mut rng);
        ItsBlock {
            sched: Mutex::new(Sched {
                rng,
                running: NONE,
                steps: 0,
                slots,
                meetings: Vec::new(),
                barrier: Vec::new(),
                error: None,
            }),
            block_idx,
            seed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the block: records the OS threads (`threads[t]` runs thread
    /// `t`, which waits in `ItsBlock::enter`) and gives the token to one
    /// of them.
    pub fn start(&self, threads: Vec<Thread>) {
        ACTIVE.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        for (s, t) in g.slots.iter_mut().zip(threads) {
            s.thread = Some(t);
        }
        let first = (splitmix(&mut g.rng) % g.slots.len().max(1) as u64) as u32;
        g.running = first;
        let t = g.slots.get(first as usize).and_then(|s| s.thread.clone());
        drop(g);
        if let Some(t) = t {
            t.unpark();
        }
    }

    /// Ends the block (after every thread has been joined).
    pub fn finish(&self) {
        ACTIVE.fetch_sub(1, Ordering::Relaxed);
    }

    /// The first error of the launch, if any (the message the kernel failed
    /// with).
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }

    fn wait_turn<'a>(&'a self, me: u32, mut g: MutexGuard<'a, Sched>) -> MutexGuard<'a, Sched> {
        while g.running != me {
            drop(g);
            std::thread::park();
            g = self.lock();
        }
        g
    }

    /// Hands the token on (after `switch`) and waits for it to come back;
    /// fails the thread if the launch failed meanwhile.
    fn yield_token<'a>(&'a self, me: u32, mut g: MutexGuard<'a, Sched>, leave: bool) -> MutexGuard<'a, Sched> {
        let next = g.switch(me, leave, self.block_idx, self.seed);
        drop(g);
        if let Some(t) = next {
            t.unpark();
        }
        let g = self.wait_turn(me, self.lock());
        self.check(g)
    }

    fn check<'a>(&'a self, g: MutexGuard<'a, Sched>) -> MutexGuard<'a, Sched> {
        if let Some(e) = &g.error {
            let e = e.clone();
            drop(g);
            panic!("{e}");
        }
        g
    }

    /// Thread `me` waits for its first turn.
    pub(super) fn enter(&self, me: u32) {
        let g = self.wait_turn(me, self.lock());
        drop(self.check(g));
    }

    /// Thread `me` has returned (or unwound): its lane is exited. A
    /// collective that names it and that other lanes wait in fails. Never
    /// panics.
    pub(super) fn exit(&self, me: u32) {
        let mut g = self.lock();
        g.slots[me as usize].status = Status::Exited;
        let (warp, lane) = (me / 32, me % 32);
        if let Some(i) = (0..g.meetings.len()).find(|&i| {
            let mt = &g.meetings[i];
            mt.op != Op::ActiveMask && mt.warp == warp && mt.mask & (1 << lane) != 0 && mt.arrived != 0
        }) {
            let msg = g.describe(i, self.block_idx, self.seed, "did not arrive");
            g.fail(format!("{msg} (lane {lane} exited)"));
        }
        self.release_barrier(&mut g);
        if g.running == me {
            let next = g.switch(me, true, self.block_idx, self.seed);
            drop(g);
            if let Some(t) = next {
                t.unpark();
            }
        }
    }

    /// A scheduling point at an atomic operation: one in
    /// [`PREEMPT_ODDS`] hands the token to another thread.
    pub(super) fn preempt(&self, me: u32) {
        let mut g = self.lock();
        if splitmix(&mut g.rng).is_multiple_of(PREEMPT_ODDS) {
            drop(self.yield_token(me, g, true));
        }
    }

    /// A scheduling point in a spin or back-off loop: another thread runs.
    pub(super) fn spin(&self, me: u32) {
        let g = self.lock();
        drop(self.yield_token(me, g, true));
    }

    /// `activemask` at `site`: joins (or starts) this warp's group at that
    /// call site and returns the group once it closes.
    pub(super) fn active_mask(&self, me: u32, site: &'static Location<'static>) -> u32 {
        let mut g = self.lock();
        let (warp, lane) = (me / 32, me % 32);
        let i = match g.meetings.iter().position(|m| m.op == Op::ActiveMask && m.warp == warp && m.site == site) {
            Some(i) => i,
            None => {
                let live = g.live_lanes(warp).count_ones();
                let r = splitmix(&mut g.rng);
                let target = match r % 4 {
                    0 => 1,
                    1 => live,
                    _ => 1 + ((r >> 8) % live as u64) as u32,
                };
                let since = g.steps;
                g.meetings.push(Meeting {
                    op: Op::ActiveMask,
                    warp,
                    mask: 0,
                    target,
                    site,
                    arrived: 0,
                    values: [0; 32],
                    since,
                    turns0: [0; 32],
                });
                g.meetings.len() - 1
            }
        };
        g.meetings[i].arrived |= 1 << lane;
        g.meetings[i].mask |= 1 << lane;
        if g.meetings[i].arrived.count_ones() >= g.meetings[i].target {
            g.complete(i);
            return g.slots[me as usize].mask;
        }
        g.slots[me as usize].status = Status::Blocked;
        let g = self.yield_token(me, g, true);
        g.slots[me as usize].mask
    }

    /// A `*.sync` collective `op` over `mask` at `site`: deposits `value`,
    /// waits for exactly the lanes of `mask`, returns every lane's value and
    /// the participating lanes (`mask`).
    pub(super) fn collective(
        &self,
        me: u32,
        op: Op,
        mask: u32,
        value: u64,
        site: &'static Location<'static>,
    ) -> ([u64; 32], u32) {
        let mut g = self.lock();
        let (warp, lane) = (me / 32, me % 32);
        let err = |g: &Sched, what: String| {
            format!(
                "independent-thread-scheduling emulation (seed {:#x}), block {} warp {warp}: {op:?} at {site} \
                 with mask {mask:#010x}: {what} (steps {})",
                self.seed, self.block_idx, g.steps
            )
        };
        if mask & (1 << lane) == 0 {
            let msg = err(&g, format!("the calling lane {lane} is not in the mask"));
            g.fail(msg);
            drop(self.check(g));
            unreachable!();
        }
        let exited = mask & g.exited_lanes(warp);
        if exited != 0 {
            let msg = err(&g, format!("lane(s) {exited:#010x} named by the mask have exited"));
            g.fail(msg);
            drop(self.check(g));
            unreachable!();
        }
        let i = match g.meetings.iter().position(|m| m.op == op && m.warp == warp && m.mask == mask) {
            Some(i) => i,
            None => {
                let since = g.steps;
                let turns0 = g.warp_turns(warp);
                g.meetings.push(Meeting {
                    op,
                    warp,
                    mask,
                    target: 0,
                    site,
                    arrived: 0,
                    values: [0; 32],
                    since,
                    turns0,
                });
                g.meetings.len() - 1
            }
        };
        g.meetings[i].arrived |= 1 << lane;
        g.meetings[i].values[lane as usize] = value;
        if g.meetings[i].arrived == mask {
            g.complete(i);
            let r = (g.slots[me as usize].values, g.slots[me as usize].mask);
            // The lanes leave the collective in any order.
            let g = self.yield_token(me, g, false);
            drop(g);
            return r;
        }
        g.slots[me as usize].status = Status::Blocked;
        let g = self.yield_token(me, g, true);
        (g.slots[me as usize].values, g.slots[me as usize].mask)
    }

    fn release_barrier(&self, g: &mut Sched) {
        let waiting = g.slots.iter().filter(|s| s.status != Status::Exited).count();
        if !g.barrier.is_empty() && g.barrier.len() >= waiting {
            for t in core::mem::take(&mut g.barrier) {
                if g.slots[t as usize].status == Status::Blocked {
                    g.slots[t as usize].status = Status::Runnable;
                }
            }
        }
    }

    /// `sync_threads`: waits until every thread of the block that has not
    /// exited arrives.
    pub(super) fn sync_threads(&self, me: u32) {
        let mut g = self.lock();
        g.barrier.push(me);
        g.slots[me as usize].status = Status::Blocked;
        self.release_barrier(&mut g);
        drop(self.yield_token(me, g, false));
    }
}
