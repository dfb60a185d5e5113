//! What the engine holds under a hostile load: a key flood cannot grow memory without bound nor
//! make it forget who is over the limit, and a flood of calls on a one-message shard mailbox is
//! decided exactly or shed, never over-admitted.

mod key_flood;
mod overload;
