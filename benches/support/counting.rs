//! A global allocator that wraps the system one and counts: allocations, bytes allocated, and
//! bytes live (allocated and not yet freed); and, while [`traced`] runs, where each allocation
//! comes from and whether it was freed before the end.
//!
//! A bench binary installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: support::counting::Counting = support::counting::Counting;
//! ```
//!
//! Other binaries that include `support` do not, and keep the system allocator untouched.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Counts every allocation, reallocation and free, and can record where each allocation
/// comes from.
pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
// Bytes allocated minus bytes freed, wrapping: differences of two readings are exact.
static LIVE: AtomicU64 = AtomicU64::new(0);
static TRACING: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Set while recording a trace, whose own allocations must not be traced.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    static TRACES: RefCell<Vec<Traced>> = const { RefCell::new(Vec::new()) };
}

/// One allocation made while [`traced`] ran.
#[derive(Debug)]
pub struct Traced {
    /// Its size in bytes.
    pub size: usize,
    /// Its address, to match its free.
    address: usize,
    /// Whether it was freed (or moved by a reallocation) before [`traced`] returned.
    pub freed: bool,
    /// Its backtrace, as `std::backtrace` prints it.
    pub trace: String,
}

/// Allocations (and reallocations) made so far.
pub fn allocations() -> u64 {
    ALLOCS.load(Relaxed)
}

/// Bytes allocated so far (a reallocation counts its new size).
pub fn bytes() -> u64 {
    BYTES.load(Relaxed)
}

/// A reading of the bytes live; subtract two readings with [`live_since`].
pub fn live() -> u64 {
    LIVE.load(Relaxed)
}

/// The bytes live now minus those live at the reading `before` (negative when more were
/// freed than allocated since).
pub fn live_since(before: u64) -> i64 {
    live().wrapping_sub(before) as i64
}

/// Runs `f` with every allocation of this thread traced; gives its result and the traces.
pub fn traced<T>(f: impl FnOnce() -> T) -> (T, Vec<Traced>) {
    TRACING.store(true, Relaxed);
    let result = f();
    TRACING.store(false, Relaxed);
    let traces = TRACES.with(|traces| std::mem::take(&mut *traces.borrow_mut()));
    (result, traces)
}

/// Runs `record` unless this thread is already recording (the recording's own allocations).
fn tracing(record: impl FnOnce()) {
    if TRACING.load(Relaxed) && !IN_TRACE.with(|t| t.replace(true)) {
        record();
        IN_TRACE.with(|t| t.set(false));
    }
}

fn allocated(address: *mut u8, size: usize) {
    ALLOCS.fetch_add(1, Relaxed);
    BYTES.fetch_add(size as u64, Relaxed);
    LIVE.fetch_add(size as u64, Relaxed);
    tracing(|| {
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let traced = Traced {
            size,
            address: address as usize,
            freed: false,
            trace,
        };
        TRACES.with(|traces| traces.borrow_mut().push(traced));
    });
}

fn freed(address: *mut u8, size: usize) {
    LIVE.fetch_sub(size as u64, Relaxed);
    tracing(|| {
        TRACES.with(|traces| {
            let mut traces = traces.borrow_mut();
            let address = address as usize;
            if let Some(traced) = traces
                .iter_mut()
                .rev()
                .find(|t| t.address == address && !t.freed)
            {
                traced.freed = true;
            }
        });
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let address = unsafe { System.alloc(layout) };
        allocated(address, layout.size());
        address
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let address = unsafe { System.alloc_zeroed(layout) };
        allocated(address, layout.size());
        address
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as given.
        let address = unsafe { System.realloc(ptr, layout, new_size) };
        freed(ptr, layout.size());
        allocated(address, new_size);
        address
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(ptr, layout.size());
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The frames of a backtrace worth reading: drops the allocator's own, and stops at the
/// runtime's or at the bench binary's `main`.
pub fn interesting(trace: &str) -> String {
    let mut out = String::new();
    for line in trace.lines() {
        let line = line.trim();
        let Some((_, symbol)) = line.split_once(": ") else {
            // "at file:line" lines follow the symbol they belong to.
            if line.starts_with("at ") && !out.is_empty() {
                out.push_str("      ");
                out.push_str(line);
                out.push('\n');
            }
            continue;
        };
        let skip = ["std::backtrace", "__rust", "alloc::alloc::"];
        if skip.iter().any(|s| symbol.starts_with(s)) || symbol.contains("support::counting::") {
            continue;
        }
        // `<binary>::main`, or a closure in it.
        let in_main = symbol.split("::").nth(1) == Some("main");
        if symbol.starts_with("tokio::runtime::") || in_main {
            break;
        }
        out.push_str("  ");
        out.push_str(symbol);
        out.push('\n');
    }
    out
}
