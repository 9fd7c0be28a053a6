//! CPU-time clocks, for figures that other processes on a loaded machine disturb less than
//! wall time: time spent waiting for a core is not counted.

// Each benchmark binary uses its own part of this module.
#![allow(dead_code)]

use std::time::Duration;

/// Which CPU-time clock to read.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    /// The calling thread's CPU time.
    Thread,
    /// The whole process's CPU time (every thread, user and system).
    Process,
}

#[cfg(target_os = "linux")]
mod sys {
    #[repr(C)]
    pub struct Timespec {
        pub tv_sec: i64,
        pub tv_nsec: i64,
    }

    pub const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    pub const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

    unsafe extern "C" {
        pub fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
}

impl Clock {
    /// The CPU time used so far, or `None` where the clock is not available.
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    pub fn now(self) -> Option<Duration> {
        let id = match self {
            Clock::Thread => sys::CLOCK_THREAD_CPUTIME_ID,
            Clock::Process => sys::CLOCK_PROCESS_CPUTIME_ID,
        };
        let mut ts = sys::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec (64-bit Linux layout) for the call.
        let rc = unsafe { sys::clock_gettime(id, &mut ts) };
        if rc != 0 {
            return None;
        }
        let secs = u64::try_from(ts.tv_sec).ok()?;
        let nanos = u32::try_from(ts.tv_nsec).ok()?;
        Some(Duration::new(secs, nanos))
    }

    /// The CPU time used so far, or `None` where the clock is not available.
    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    pub fn now(self) -> Option<Duration> {
        None
    }
}
