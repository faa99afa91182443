//! Barrier alignment (in progress).
