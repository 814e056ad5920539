//! The ledger pipeline: how a decided change becomes a committed ledger entry, a type of
//! its own ([`Pipeline`]) whose parts no other part of the engine reaches. In process,
//! the change and its entries are one unit of work ([`unit`]): the group-commit
//! [`writer`] commits the entries before the answer, or the change is undone. On Redis,
//! the script appends them to a ledger [`stream`] in the same atomic step, and the
//! [`drain`] moves them into SQL, bounded by the [`backlog`]. [`lag`] measures how long
//! either takes.

pub mod backlog;
pub mod drain;
pub(crate) mod fold;
pub mod lag;
pub(crate) mod stream;
mod unit;
pub mod writer;

pub(crate) use unit::Pipeline;
