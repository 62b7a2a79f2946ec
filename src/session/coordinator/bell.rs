//! The doorbell: the wakes that arrive while a turn runs, coalesced into one follow-up drain.

use super::Seq;

/// A rung doorbell: `seq` is the max admission seq of the coalesced sequenced wakes, and
/// `unsequenced` whether any of them had no seq. The two parts are kept apart so that an
/// interrupt, which covers every unsequenced wake, does not also drop a newer sequenced one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bell {
    pub(super) seq: Option<Seq>,
    pub(super) unsequenced: bool,
}

impl Bell {
    pub(super) fn merge(existing: Option<Bell>, seq: Option<Seq>) -> Bell {
        let bell = existing.unwrap_or(Bell {
            seq: None,
            unsequenced: false,
        });
        match seq {
            None => Bell {
                unsequenced: true,
                ..bell
            },
            Some(s) => Bell {
                seq: Some(bell.seq.map_or(s, |b| b.max(s))),
                ..bell
            },
        }
    }

    /// The fence of a drain serving this bell: None when any of its wakes was unsequenced.
    pub(super) fn wake_seq(self) -> Option<Seq> {
        if self.unsequenced {
            None
        } else {
            self.seq
        }
    }

    /// What an interrupt with `seq` (None = unsequenced) leaves of this bell: it covers the
    /// unsequenced wakes and the wakes at or before `seq`.
    pub(super) fn after_interrupt(self, seq: Option<Seq>) -> Option<Bell> {
        match (seq, self.seq) {
            (Some(s), Some(b)) if b > s => Some(Bell {
                seq: Some(b),
                unsequenced: false,
            }),
            _ => None,
        }
    }
}
