//! The checkpoint coordinator (in progress).
