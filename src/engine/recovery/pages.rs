//! The ledger read page after page, a page ahead: a task of its own reads the next page
//! (the database's work, and decoding its rows) while the replay applies this one, so that
//! a rebuild or a backtest keeps both of the machine's cores busy.

use crate::domain::{Action, LedgerEntry};
use crate::engine::ledger::{LedgerError, LedgerStore};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How many pages the reader may have read ahead of the replay.
const AHEAD: usize = 2;

/// A page: entries with their `seq`, in insertion order.
type Page = Vec<(i64, LedgerEntry)>;

/// The ledger's entries after a `seq`, page by page ([`Pages::next`]); the reader stops
/// when the ledger has no more, at its first error, or when this is dropped.
pub(in crate::engine) struct Pages {
    pages: mpsc::Receiver<Result<Page, LedgerError>>,
    reader: JoinHandle<()>,
}

impl Pages {
    /// Starts reading the entries inserted after `after` (of `action` only, when given),
    /// `page` at a time.
    pub(in crate::engine) fn after(
        ledger: Arc<dyn LedgerStore>,
        after: i64,
        page: u32,
        action: Option<Action>,
    ) -> Self {
        let (sender, pages) = mpsc::channel(AHEAD);
        let reader = tokio::spawn(async move {
            let mut after = after;
            loop {
                let read = ledger.entries_after(after, page, action.as_ref()).await;
                let last = read
                    .as_ref()
                    .ok()
                    .and_then(|p| p.last())
                    .map(|(seq, _)| *seq);
                if sender.send(read).await.is_err() {
                    return;
                }
                match last {
                    Some(last) => after = last,
                    None => return,
                }
            }
        });
        Self { pages, reader }
    }

    /// The next page; empty once the ledger has no more.
    pub(in crate::engine) async fn next(&mut self) -> Result<Page, LedgerError> {
        self.pages.recv().await.unwrap_or_else(|| Ok(Vec::new()))
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
