//! The frames around a payload, as vLLM's `ZmqEventPublisher` sends them: the one place these
//! layouts are written down for both the subscriber (server) and the publisher (mock engine).
//!
//! - Published on the PUB socket: `[topic, seq as 8 bytes big-endian, payload]`, `seq`
//!   counting from 0 and one higher for every batch.
//! - Replay, on a ROUTER socket: a client sends `[b"", start_seq as 8 bytes]` (what a REQ
//!   socket sends, a DEALER sends it by hand), and receives `[b"", topic, seq, payload]` for
//!   every batch still buffered from `start_seq` on, then `[b"", b"", -1 as 8 signed bytes,
//!   b""]` (vLLM since its PR #45177, June 2026; before it, the same without the topic frame:
//!   `[b"", seq, payload]` and `[b"", -1, b""]`; both are read).

/// The PUB port vLLM's examples use (`tcp://*:5557`).
pub const DEFAULT_PORT: u16 = 5557;
/// The replay port vLLM's examples use (`tcp://*:5558`).
pub const DEFAULT_REPLAY_PORT: u16 = 5558;
/// Sequence frames are 8 bytes, big-endian.
pub const SEQ_LEN: usize = 8;
/// The sequence number that ends a replay.
pub const END_OF_REPLAY: i64 = -1;

/// A frame layout that is not one of the above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{what}: {frames} frames, expected {expected}")]
    Frames {
        what: &'static str,
        frames: usize,
        expected: usize,
    },
    #[error("sequence frame of {0} bytes, expected 8")]
    SeqLen(usize),
    #[error("negative sequence number {0}")]
    NegativeSeq(i64),
}

/// A sequence number's frame.
pub fn seq_frame(seq: u64) -> [u8; SEQ_LEN] {
    seq.to_be_bytes()
}

/// The frame that ends a replay.
pub fn end_of_replay_frame() -> [u8; SEQ_LEN] {
    END_OF_REPLAY.to_be_bytes()
}

/// Reads a sequence frame (signed: the end of a replay is -1).
pub fn parse_seq(frame: &[u8]) -> Result<i64, WireError> {
    let bytes: [u8; SEQ_LEN] = frame
        .try_into()
        .map_err(|_| WireError::SeqLen(frame.len()))?;
    Ok(i64::from_be_bytes(bytes))
}

fn unsigned(frame: &[u8]) -> Result<u64, WireError> {
    let s = parse_seq(frame)?;
    u64::try_from(s).map_err(|_| WireError::NegativeSeq(s))
}

/// One published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published<'a> {
    pub topic: &'a [u8],
    pub seq: u64,
    pub payload: &'a [u8],
}

/// Splits a published message.
pub fn published<F: AsRef<[u8]>>(frames: &[F]) -> Result<Published<'_>, WireError> {
    match frames {
        [topic, seq, payload] => Ok(Published {
            topic: topic.as_ref(),
            seq: unsigned(seq.as_ref())?,
            payload: payload.as_ref(),
        }),
        _ => Err(WireError::Frames {
            what: "published message",
            frames: frames.len(),
            expected: 3,
        }),
    }
}

/// One reply to a replay request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed<'a> {
    Batch { seq: u64, payload: &'a [u8] },
    End,
}

/// Splits a replay reply as a DEALER receives it (`[b"", topic, seq, payload]`, or before
/// vLLM's topic frame `[b"", seq, payload]`), or as a REQ socket does (`[topic, seq, payload]`
/// or `[seq, payload]`). A reply that read as malformed was dropped and the replay waited out
/// its timeout: with the topic frame, every replay from a current vLLM.
pub fn replayed<F: AsRef<[u8]>>(frames: &[F]) -> Result<Replayed<'_>, WireError> {
    let frames = match frames {
        // The delimiter, then the topic.
        [empty, _topic, rest @ ..] if empty.as_ref().is_empty() && rest.len() == 2 => rest,
        // The delimiter, or (a REQ socket) the topic.
        [_, rest @ ..] if rest.len() == 2 => rest,
        _ => frames,
    };
    match frames {
        [seq, payload] => {
            let seq = parse_seq(seq.as_ref())?;
            if seq == END_OF_REPLAY {
                return Ok(Replayed::End);
            }
            let seq = u64::try_from(seq).map_err(|_| WireError::NegativeSeq(seq))?;
            Ok(Replayed::Batch {
                seq,
                payload: payload.as_ref(),
            })
        }
        _ => Err(WireError::Frames {
            what: "replay reply",
            frames: frames.len(),
            expected: 2,
        }),
    }
}

/// The frames a DEALER sends to ask for every batch from `start` on.
pub fn replay_request(start: u64) -> [Vec<u8>; 2] {
    [Vec::new(), seq_frame(start).to_vec()]
}

/// The start a replay request asks for, from the frames a ROUTER receives after the client's
/// identity (`[b"", start]`).
pub fn parse_replay_request<F: AsRef<[u8]>>(frames: &[F]) -> Result<u64, WireError> {
    match frames {
        [empty, start] if empty.as_ref().is_empty() => unsigned(start.as_ref()),
        _ => Err(WireError::Frames {
            what: "replay request",
            frames: frames.len(),
            expected: 2,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_as_vllm_lays_them_out() {
        let frames = [b"kv".to_vec(), vec![0, 0, 0, 0, 0, 0, 1, 2], vec![0x90]];
        let p = published(&frames).unwrap();
        assert_eq!(p.topic, b"kv");
        assert_eq!(p.seq, 258);
        assert_eq!(p.payload, [0x90]);
        assert!(matches!(
            published(&[b"kv".to_vec(), vec![0; 8]]),
            Err(WireError::Frames { frames: 2, .. })
        ));
        assert_eq!(
            published(&[b"".to_vec(), vec![0; 7], vec![]]),
            Err(WireError::SeqLen(7))
        );
        // The end marker: -1 as 8 signed big-endian bytes, then an empty payload.
        assert_eq!(end_of_replay_frame(), [0xff; 8]);
        let end = [b"".to_vec(), end_of_replay_frame().to_vec(), Vec::new()];
        assert_eq!(replayed(&end).unwrap(), Replayed::End);
        assert_eq!(replayed(&end[1..]).unwrap(), Replayed::End);
        let one = [Vec::new(), seq_frame(7).to_vec(), vec![1, 2]];
        assert_eq!(
            replayed(&one).unwrap(),
            Replayed::Batch {
                seq: 7,
                payload: &[1, 2]
            }
        );
        // Since vLLM's topic frame: `[b"", topic, seq, payload]`, and the end with an empty one.
        let topical = [Vec::new(), b"kv".to_vec(), seq_frame(9).to_vec(), vec![3]];
        assert_eq!(
            replayed(&topical).unwrap(),
            Replayed::Batch {
                seq: 9,
                payload: &[3]
            }
        );
        assert_eq!(
            replayed(&topical[1..]).unwrap(),
            replayed(&topical).unwrap()
        );
        let end = [
            Vec::new(),
            Vec::new(),
            end_of_replay_frame().to_vec(),
            Vec::new(),
        ];
        assert_eq!(replayed(&end).unwrap(), Replayed::End);
        assert!(replayed(&[vec![1u8], vec![], seq_frame(1).to_vec(), vec![]]).is_err());
        assert_eq!(parse_replay_request(&replay_request(42)).unwrap(), 42);
        assert!(parse_replay_request(&[seq_frame(1).to_vec()]).is_err());
    }
}
