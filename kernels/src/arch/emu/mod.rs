//! Host emulation of the GPU execution model (the CPU backend's runtime).
//!
//! The host crate's CPU launcher runs every emulated GPU thread inside
//! [`run_thread`], which installs a thread-local [`ThreadCtx`]; the functions
//! of [`super::index`], [`super::warp`] and [`super::block`] read it.
//!
//! Two ways to run a block, chosen by the launcher:
//!
//! * **sequential** (`warp` and `block` are `None`): the block's threads run
//!   one after another on one worker. Every warp has one lane: lane 0, active
//!   mask `1`, ballots and shuffles act on that lane alone. Fast; for kernels
//!   whose threads never wait for each other inside a block.
//! * **lockstep** (`warp` and `block` set): each thread of the block is its own
//!   OS thread; the 32 lanes of a warp meet at every warp intrinsic through a
//!   [`WarpRendezvous`], and `sync_threads` is a real barrier. This exercises
//!   warp-aggregated code paths without a GPU.
//!
//! * **independent** (`its` set): the GPU's independent thread scheduling,
//!   adversarially: each thread is an OS thread, one runs at a time under a
//!   seeded scheduler that preempts at atomics and spins, `active_mask`
//!   returns groups of every shape, and `*.sync` collectives meet exactly
//!   their mask's lanes, with errors instead of hangs (see [`its`]).
//!
//! Lockstep limitation: a warp intrinsic is a meeting of *all live lanes* of
//! the warp (lanes that have not returned from the kernel). Kernels must call
//! warp intrinsics at warp-uniform points, as the allocator's entry points are
//! called by the tests; a lane that skips a collective its peers enter, while
//! staying alive, deadlocks the emulated warp. On a GPU such divergence is
//! legal and the active mask simply shrinks: the independent mode tests that.

pub mod its;

use std::boxed::Box;
use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::{Arc, Barrier, Condvar, Mutex};

pub use its::{ItsBlock, Op};

/// Indices and lockstep objects of one emulated GPU thread.
#[derive(Clone)]
pub struct ThreadCtx {
    /// Index in the block.
    pub thread_idx: u32,
    /// Index of the block in the grid.
    pub block_idx: u32,
    /// Threads per block.
    pub block_dim: u32,
    /// Blocks in the grid.
    pub grid_dim: u32,
    /// The warp rendezvous (lockstep mode), or `None` for one-lane warps.
    pub warp: Option<Arc<WarpRendezvous>>,
    /// The block's barrier and shared memory, if the launch has them.
    pub block: Option<Arc<BlockShared>>,
    /// The block's scheduler in independent-thread-scheduling mode (then
    /// `warp` is `None` and warps have 32 lanes).
    pub its: Option<Arc<ItsBlock>>,
}

impl ThreadCtx {
    /// Lane in the warp: `thread_idx % 32` in lockstep and independent
    /// mode, else 0.
    pub fn lane_id(&self) -> u32 {
        if self.warp.is_some() || self.its.is_some() {
            self.thread_idx % super::WARP_SIZE
        } else {
            0
        }
    }

    /// Global warp index: in lockstep mode counted over 32-lane warps of the
    /// whole grid; in sequential mode every thread is its own warp.
    pub fn global_warp_id(&self) -> u64 {
        let tid = self.block_idx as u64 * self.block_dim as u64 + self.thread_idx as u64;
        if self.warp.is_some() || self.its.is_some() {
            let warps_per_block = self.block_dim.div_ceil(super::WARP_SIZE) as u64;
            self.block_idx as u64 * warps_per_block + (self.thread_idx / super::WARP_SIZE) as u64
        } else {
            tid
        }
    }
}

#[derive(Clone, Copy)]
struct Indices {
    thread_idx: u32,
    block_idx: u32,
    block_dim: u32,
    grid_dim: u32,
    /// 32-lane warps (lockstep or independent mode).
    lockstep: bool,
}

std::thread_local! {
    static INDICES: Cell<Indices> = const { Cell::new(Indices { thread_idx: 0, block_idx: 0, block_dim: 1, grid_dim: 1, lockstep: false }) };
    static WARP: RefCell<Option<Arc<WarpRendezvous>>> = const { RefCell::new(None) };
    static BLOCK: RefCell<Option<Arc<BlockShared>>> = const { RefCell::new(None) };
    static ITS: RefCell<Option<Arc<ItsBlock>>> = const { RefCell::new(None) };
}

/// Reads this thread's context. Outside [`run_thread`], a 1×1 grid.
pub fn ctx<R>(f: impl FnOnce(&ThreadCtx) -> R) -> R {
    let i = INDICES.with(|c| c.get());
    let warp = if i.lockstep { WARP.with(|w| w.borrow().clone()) } else { None };
    let its = if i.lockstep && warp.is_none() { ITS.with(|w| w.borrow().clone()) } else { None };
    f(&ThreadCtx {
        thread_idx: i.thread_idx,
        block_idx: i.block_idx,
        block_dim: i.block_dim,
        grid_dim: i.grid_dim,
        warp,
        block: None,
        its,
    })
}

/// How this thread's warp meets: one lane, the lockstep rendezvous, or the
/// independent-thread-scheduling block scheduler (with this thread's index).
pub(crate) enum WarpOf<'a> {
    One,
    Lockstep(&'a WarpRendezvous, u32),
    Its(&'a ItsBlock, u32),
}

pub(crate) fn with_warp<R>(f: impl FnOnce(WarpOf<'_>) -> R) -> R {
    let i = INDICES.with(|c| c.get());
    if !i.lockstep {
        return f(WarpOf::One);
    }
    let r = WARP.with(|w| w.borrow().clone());
    if let Some(w) = r {
        return f(WarpOf::Lockstep(&w, i.thread_idx % super::WARP_SIZE));
    }
    let its = ITS.with(|w| w.borrow().clone());
    match its {
        Some(s) => f(WarpOf::Its(&s, i.thread_idx)),
        None => f(WarpOf::One),
    }
}

/// A warp collective of this lane (`op` over `mask`, depositing `value`),
/// called at `site`: `None` for a one-lane warp, else every lane's value and
/// the participating lanes.
pub(crate) fn warp_collective(
    op: Op,
    mask: u32,
    value: u64,
    site: &'static Location<'static>,
) -> Option<([u64; 32], u32)> {
    with_warp(|w| match w {
        WarpOf::One => None,
        WarpOf::Lockstep(r, lane) => Some(r.exchange(lane, value)),
        WarpOf::Its(s, me) => Some(s.collective(me, op, mask, value, site)),
    })
}

/// `activemask` at `site` (see [`its`] for the independent mode).
pub(crate) fn active_mask(site: &'static Location<'static>) -> u32 {
    with_warp(|w| match w {
        WarpOf::One => 1,
        WarpOf::Lockstep(r, lane) => r.exchange(lane, 0).1,
        WarpOf::Its(s, me) => s.active_mask(me, site),
    })
}

/// The lanes of this thread's warp that the launch created (see
/// [`super::warp::launch_mask`]): `1` for the one-lane warps of the
/// sequential mode, else the warp's lanes below the block size.
pub(crate) fn launch_mask() -> u32 {
    let i = INDICES.with(|c| c.get());
    with_warp(|w| match w {
        WarpOf::One => 1,
        WarpOf::Lockstep(..) | WarpOf::Its(..) => super::warp::lanes_below(i.block_dim - (i.thread_idx & !31)),
    })
}

/// In independent mode, `f` with this thread's scheduler and index.
#[inline(always)]
fn with_its(f: impl FnOnce(&ItsBlock, u32)) {
    if its::ACTIVE.load(core::sync::atomic::Ordering::Relaxed) == 0 {
        return;
    }
    let i = INDICES.with(|c| c.get());
    if !i.lockstep {
        return;
    }
    if let Some(s) = ITS.with(|w| w.borrow().clone()) {
        f(&s, i.thread_idx)
    }
}

/// A scheduling point at an atomic operation (independent mode only).
#[inline(always)]
pub(crate) fn preempt() {
    with_its(|s, me| s.preempt(me))
}

/// A scheduling point in a spin or back-off loop (independent mode only).
/// Returns `true` when it ran another thread.
#[inline(always)]
pub(crate) fn spin() -> bool {
    let mut ran = false;
    with_its(|s, me| {
        s.spin(me);
        ran = true;
    });
    ran
}

/// `sync_threads` in independent mode; `false` in the other modes.
pub(crate) fn its_sync_threads() -> bool {
    let mut done = false;
    with_its(|s, me| {
        s.sync_threads(me);
        done = true;
    });
    done
}

pub(crate) fn with_block<R>(f: impl FnOnce(Option<&BlockShared>) -> R) -> R {
    BLOCK.with(|b| f(b.borrow().as_deref()))
}

/// Runs `f` as the emulated GPU thread described by `ctx`, then marks its lane
/// as exited (also when `f` panics), so the rest of its warp goes on.
pub fn run_thread<R>(ctx: ThreadCtx, f: impl FnOnce() -> R) -> R {
    struct Exit(Option<Arc<WarpRendezvous>>, u32, Option<Arc<ItsBlock>>, u32);
    impl Drop for Exit {
        fn drop(&mut self) {
            if let Some(w) = &self.0 {
                w.exit(self.1);
            }
            if let Some(s) = &self.2 {
                s.exit(self.3);
            }
            WARP.with(|w| *w.borrow_mut() = None);
            BLOCK.with(|b| *b.borrow_mut() = None);
            ITS.with(|b| *b.borrow_mut() = None);
            INDICES
                .with(|c| c.set(Indices { thread_idx: 0, block_idx: 0, block_dim: 1, grid_dim: 1, lockstep: false }));
        }
    }
    let lane = ctx.lane_id();
    INDICES.with(|c| {
        c.set(Indices {
            thread_idx: ctx.thread_idx,
            block_idx: ctx.block_idx,
            block_dim: ctx.block_dim,
            grid_dim: ctx.grid_dim,
            lockstep: ctx.warp.is_some() || ctx.its.is_some(),
        })
    });
    WARP.with(|w| *w.borrow_mut() = ctx.warp.clone());
    BLOCK.with(|b| *b.borrow_mut() = ctx.block.clone());
    ITS.with(|b| *b.borrow_mut() = ctx.its.clone());
    let _exit = Exit(ctx.warp, lane, ctx.its.clone(), ctx.thread_idx);
    if let Some(s) = &ctx.its {
        s.enter(ctx.thread_idx);
    }
    f()
}

/// Runs the `block_dim` threads of block `block_idx` one after another on
/// this OS thread (sequential mode: one-lane warps), calling `f` once per
/// thread with that thread's indices installed. Cheaper than calling
/// [`run_thread`] per thread: the block's state is installed once.
pub fn run_block_sequential(
    block_idx: u32,
    block_dim: u32,
    grid_dim: u32,
    block: Option<Arc<BlockShared>>,
    mut f: impl FnMut(),
) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BLOCK.with(|b| *b.borrow_mut() = None);
            INDICES
                .with(|c| c.set(Indices { thread_idx: 0, block_idx: 0, block_dim: 1, grid_dim: 1, lockstep: false }));
        }
    }
    WARP.with(|w| *w.borrow_mut() = None);
    BLOCK.with(|b| *b.borrow_mut() = block);
    let _reset = Reset;
    for t in 0..block_dim {
        INDICES.with(|c| c.set(Indices { thread_idx: t, block_idx, block_dim, grid_dim, lockstep: false }));
        f();
    }
}

/// Where the live lanes of one emulated warp meet at each warp intrinsic.
///
/// Each collective deposits one 64-bit value per lane; when every live lane
/// has arrived, all of them see every lane's value and the mask of lanes
/// that took part.
pub struct WarpRendezvous {
    state: Mutex<WarpState>,
    cv: Condvar,
}

struct WarpState {
    live: u32,
    arrived: u32,
    values: [u64; 32],
    result: [u64; 32],
    participants: u32,
    generation: u64,
}

impl WarpRendezvous {
    /// A warp whose live lanes are the set bits of `live_mask`.
    pub fn new(live_mask: u32) -> Self {
        Self {
            state: Mutex::new(WarpState {
                live: live_mask,
                arrived: 0,
                values: [0; 32],
                result: [0; 32],
                participants: 0,
                generation: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Deposits `value` for `lane` and waits for the other live lanes.
    /// Returns every lane's value and the mask of participating lanes.
    pub fn exchange(&self, lane: u32, value: u64) -> ([u64; 32], u32) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.values[lane as usize] = value;
        s.arrived |= 1 << lane;
        if s.arrived == s.live {
            Self::complete(&mut s);
            self.cv.notify_all();
            return (s.result, s.participants);
        }
        let gen = s.generation;
        while s.generation == gen {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        (s.result, s.participants)
    }

    fn complete(s: &mut WarpState) {
        s.result = s.values;
        s.participants = s.arrived;
        s.arrived = 0;
        s.generation += 1;
    }

    /// Marks `lane` as exited; a collective waiting only for it completes.
    pub fn exit(&self, lane: u32) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.live &= !(1 << lane);
        if s.arrived != 0 && s.arrived == s.live {
            Self::complete(&mut s);
            self.cv.notify_all();
        }
    }
}

/// Per-block state in lockstep mode: the `sync_threads` barrier and the
/// block's dynamic shared memory.
pub struct BlockShared {
    barrier: Option<Barrier>,
    shared: Box<[u128]>,
}

impl BlockShared {
    /// `threads` threads meet at the barrier (`None`: sequential mode, no
    /// barrier); `shared_bytes` of zeroed, 16-byte aligned shared memory.
    pub fn new(threads: Option<u32>, shared_bytes: usize) -> Self {
        Self {
            barrier: threads.map(|t| Barrier::new(t as usize)),
            shared: std::vec![0u128; shared_bytes.div_ceil(16)].into_boxed_slice(),
        }
    }

    pub(crate) fn sync(&self) {
        match &self.barrier {
            Some(b) => {
                b.wait();
            }
            None => panic!("sync_threads() in a sequential CPU launch: launch this kernel in lockstep mode"),
        }
    }

    pub(crate) fn shared_ptr(&self) -> (*mut u8, usize) {
        (self.shared.as_ptr() as *mut u8, self.shared.len() * 16)
    }
}
