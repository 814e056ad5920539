//! The snapshot of the in-process counter store (`engine::snapshot`): its state items as
//! binary parts of a few MiB, the rows of the `counter_snapshots` table.
//!
//! Binary rather than JSON: a million items load in a fraction of a second, and a part is
//! one SQL value. Each part is a run of whole items, so a part decodes on its own. An item
//! is a tag byte and its fields; integers are little-endian (`i64`/`u64` 8 bytes, lengths
//! `u32` 4 bytes), text is its length then UTF-8:
//!
//! | tag | item | fields |
//! |-----|------|--------|
//! | 1 | calendar counter | key, expiry, used |
//! | 2 | rolling counter | key, expiry, bucket count, then (index `i64`, units `u64`) each |
//! | 3 | token bucket | key, expiry, `s`, `t` |
//! | 4 | record | key, expiry, text |
//! | 5 | open hold in an index | index key, expiry (its score), hold id |
//! | 6 | a key that went (deltas only) | key, 0 |
//!
//! The format's version is [`SNAPSHOT_FORMAT`], kept beside the parts: a change of this
//! layout is a new version, and a snapshot of another version is not read (the start
//! replays the ledger instead). A delta (a checkpoint that holds only what changed,
//! [`encode_delta`]) is the items of the keys that changed, every item of each (every open
//! hold of an index that changed), then the keys that went; its version is
//! [`DELTA_FORMAT`].

use super::CodecError;
use crate::engine::state::{CounterState, StateItem};

/// The version of this encoding, stored with every snapshot.
pub(crate) const SNAPSHOT_FORMAT: i32 = 1;

/// The version of a delta's encoding, stored with every delta.
pub(crate) const DELTA_FORMAT: i32 = 1;

/// A part is closed once it holds this many bytes (plus at most one item).
const PART_BYTES: usize = 4 << 20;

/// What a decoding error is about.
const WHAT: &str = "counter snapshot";

/// Encodes `items` into parts of about [`PART_BYTES`], in order; at least one part (empty
/// for an empty store), so that a snapshot of nothing is still a snapshot.
pub(crate) fn encode_snapshot(items: &[StateItem]) -> Vec<Vec<u8>> {
    encode_delta(items, &[])
}

/// Encodes a delta: the `changed` items, then the keys `gone`, into parts as
/// [`encode_snapshot`] does.
pub(crate) fn encode_delta(changed: &[StateItem], gone: &[String]) -> Vec<Vec<u8>> {
    let mut parts = Vec::new();
    let mut part = Vec::new();
    let mut close = |part: &mut Vec<u8>| {
        if part.len() >= PART_BYTES {
            parts.push(std::mem::take(part));
        }
    };
    for item in changed {
        encode_item(&mut part, item);
        close(&mut part);
    }
    for key in gone {
        part.push(6);
        put_text(&mut part, key);
        part.extend_from_slice(&0i64.to_le_bytes());
        close(&mut part);
    }
    if !part.is_empty() || parts.is_empty() {
        parts.push(part);
    }
    parts
}

/// The bytes [`encode_snapshot`] writes for `item` (to tell a changed item from one that
/// stayed the same).
pub(crate) fn item_bytes(item: &StateItem, out: &mut Vec<u8>) {
    out.clear();
    encode_item(out, item);
}

fn encode_item(out: &mut Vec<u8>, item: &StateItem) {
    match item {
        StateItem::Counter {
            key,
            expires_at_ms,
            state,
        } => {
            let tag = match state {
                CounterState::Calendar { .. } => 1,
                CounterState::Rolling { .. } => 2,
                CounterState::TokenBucket { .. } => 3,
            };
            out.push(tag);
            put_text(out, key);
            out.extend_from_slice(&expires_at_ms.to_le_bytes());
            match state {
                CounterState::Calendar { used } => out.extend_from_slice(&used.to_le_bytes()),
                CounterState::Rolling { buckets } => {
                    put_len(out, buckets.len());
                    for (index, units) in buckets {
                        out.extend_from_slice(&index.to_le_bytes());
                        out.extend_from_slice(&units.to_le_bytes());
                    }
                }
                CounterState::TokenBucket { s, t_ms } => {
                    out.extend_from_slice(&s.to_le_bytes());
                    out.extend_from_slice(&t_ms.to_le_bytes());
                }
            }
        }
        StateItem::Record {
            key,
            text,
            expires_at_ms,
        } => {
            out.push(4);
            put_text(out, key);
            out.extend_from_slice(&expires_at_ms.to_le_bytes());
            put_text(out, text);
        }
        StateItem::IndexedHold {
            index_key,
            hold_id,
            expires_at_ms,
        } => {
            out.push(5);
            put_text(out, index_key);
            out.extend_from_slice(&expires_at_ms.to_le_bytes());
            put_text(out, hold_id);
        }
    }
}

/// A length as 4 bytes. Keys, records and bucket lists are far below 4 GiB (a record is
/// at most a few KiB; a rolling counter has at most a few thousand buckets).
fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    put_len(out, text.len());
    out.extend_from_slice(text.as_bytes());
}

/// Decodes every part, in order, into the items [`encode_snapshot`] was given.
pub(crate) fn decode_snapshot(parts: &[Vec<u8>]) -> Result<Vec<StateItem>, CodecError> {
    match decode_delta(parts)? {
        (items, gone) if gone.is_empty() => Ok(items),
        _ => Err(CodecError::new(WHAT, "a key that went, in a full snapshot")),
    }
}

/// Decodes a delta into the items and the keys gone [`encode_delta`] was given.
pub(crate) fn decode_delta(parts: &[Vec<u8>]) -> Result<(Vec<StateItem>, Vec<String>), CodecError> {
    let (mut items, mut gone) = (Vec::new(), Vec::new());
    for part in parts {
        let mut reader = Reader { rest: part };
        while !reader.rest.is_empty() {
            match reader.item()? {
                Read::Item(item) => items.push(item),
                Read::Gone(key) => gone.push(key),
            }
        }
    }
    Ok((items, gone))
}

/// What one item of a part says.
enum Read {
    /// A state item.
    Item(StateItem),
    /// A key that went (a delta).
    Gone(String),
}

/// Reads items off the front of a part.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn item(&mut self) -> Result<Read, CodecError> {
        let tag = self.take(1)?[0];
        let key = self.text()?;
        let expires_at_ms = self.i64()?;
        let counter = |state| StateItem::Counter {
            key: key.clone(),
            expires_at_ms,
            state,
        };
        if tag == 6 {
            return Ok(Read::Gone(key));
        }
        Ok(Read::Item(match tag {
            1 => counter(CounterState::Calendar { used: self.u64()? }),
            2 => {
                let count = self.len()?;
                // Bounded by what is left, so a corrupt count cannot allocate much.
                let mut buckets = Vec::with_capacity(count.min(self.rest.len() / 16));
                for _ in 0..count {
                    buckets.push((self.i64()?, self.u64()?));
                }
                counter(CounterState::Rolling { buckets })
            }
            3 => counter(CounterState::TokenBucket {
                s: self.u64()?,
                t_ms: self.i64()?,
            }),
            4 => StateItem::Record {
                key,
                text: self.text()?,
                expires_at_ms,
            },
            5 => StateItem::IndexedHold {
                index_key: key,
                hold_id: self.text()?,
                expires_at_ms,
            },
            other => return Err(CodecError::new(WHAT, format!("unknown item tag {other}"))),
        }))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.rest.len() < n {
            return Err(CodecError::new(WHAT, "a part ends inside an item"));
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut bytes = [0; N];
        bytes.copy_from_slice(self.take(N)?);
        Ok(bytes)
    }

    fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn len(&mut self) -> Result<usize, CodecError> {
        Ok(u32::from_le_bytes(self.bytes()?) as usize)
    }

    fn text(&mut self) -> Result<String, CodecError> {
        let len = self.len()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| CodecError::new(WHAT, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items() -> Vec<StateItem> {
        vec![
            StateItem::Counter {
                key: "ql:{transfer|u-1}:abc:20261121".to_owned(),
                expires_at_ms: 1_800_000_000_000,
                state: CounterState::Calendar { used: 3 },
            },
            StateItem::Counter {
                key: "ql:{transfer|u-1}:def".to_owned(),
                expires_at_ms: -5,
                state: CounterState::Rolling {
                    buckets: vec![(-1, 0), (28_000_000, (1 << 53) - 1)],
                },
            },
            StateItem::Counter {
                key: "ql:{transfer|ü}:ghi".to_owned(),
                expires_at_ms: i64::MAX,
                state: CounterState::TokenBucket {
                    s: 120_000,
                    t_ms: 1_700_000_000_123,
                },
            },
            StateItem::Record {
                key: "ql:{7}#h:0190.7".to_owned(),
                text: "open\n{\"action\":\"transfer\"}".to_owned(),
                expires_at_ms: 42,
            },
            StateItem::Record {
                key: "ql:{7}#rf:x".to_owned(),
                text: String::new(),
                expires_at_ms: 0,
            },
            StateItem::IndexedHold {
                index_key: "ql:{7}#holds".to_owned(),
                hold_id: "0190.7".to_owned(),
                expires_at_ms: 1_700_000_600_000,
            },
        ]
    }

    #[test]
    fn every_kind_of_item_decodes_to_what_was_encoded() {
        let parts = encode_snapshot(&items());
        assert_eq!(parts.len(), 1);
        assert_eq!(decode_snapshot(&parts), Ok(items()));
        assert_eq!(decode_snapshot(&[]), Ok(Vec::new()));
    }

    #[test]
    fn a_delta_decodes_to_its_items_and_the_keys_gone_and_is_no_full_snapshot() {
        let gone = vec!["ql:{7}#rf:y".to_owned(), "ql:{transfer|u-2}:abc".to_owned()];
        let parts = encode_delta(&items(), &gone);
        assert_eq!(decode_delta(&parts), Ok((items(), gone)));
        assert!(
            decode_snapshot(&parts).is_err(),
            "a key that went means nothing to a full snapshot"
        );
        assert_eq!(
            decode_delta(&encode_snapshot(&items())),
            Ok((items(), vec![]))
        );
    }

    #[test]
    fn a_large_state_is_split_into_parts_of_whole_items() {
        let record = StateItem::Record {
            key: "k".to_owned(),
            text: "x".repeat(100_000),
            expires_at_ms: 1,
        };
        let many = vec![record; 100];
        let parts = encode_snapshot(&many);
        assert_eq!(parts.len(), 3, "10 MB in parts of 4 MiB");
        for part in &parts {
            assert!(decode_snapshot(std::slice::from_ref(part)).is_ok());
        }
        assert_eq!(decode_snapshot(&parts), Ok(many));
    }

    #[test]
    fn a_damaged_part_is_an_error_never_a_partial_state() {
        let part = encode_snapshot(&items()).remove(0);
        let mut unknown_tag = part.clone();
        unknown_tag[0] = 9;
        let mut bad_utf8 = part.clone();
        bad_utf8[5] = 0xff;
        for damaged in [
            part[..part.len() - 1].to_vec(),
            part[..3].to_vec(),
            unknown_tag,
            bad_utf8,
        ] {
            assert!(decode_snapshot(&[damaged]).is_err());
        }
    }
}
