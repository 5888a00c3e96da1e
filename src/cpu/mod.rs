//! What makes the simulator fast on a CPU, and nothing else: the allocator's settings
//! ([`alloc`]) and cache hints ([`prefetch`]). Only speed depends on this module, never a
//! result. It is the bottom layer: the simulator's host and event kernel use it, actors never
//! do (their one hint to a host is [`crate::actor::Actor::hot`]).

pub mod alloc;
pub mod prefetch;
