//! The control attributes (`trusted.anvil.*`): how the command line talks to a mounted
//! volume. Each name parses to one `Control`, which says where it applies and whether it
//! can be read, written, or both; the adapter then matches on the enum, never on strings.

use crate::{
    CLEANUP_XATTR, COMPRESSION_XATTR, COPY_XATTR, DROPCACHE_XATTR, EVICT_XATTR, HISTORY_XATTR,
    INFO_XATTR, MIRROR_ATTACH_XATTR, MIRROR_PROMOTE_XATTR, MIRROR_READ_XATTR, MIRROR_WRITE_XATTR,
    MIRROR_XATTR, NEAR_XATTR, NOHISTORY_XATTR, POLICY_XATTR, PRUNE_XATTR, REBLOCK_XATTR,
    REQUESTS_XATTR, SNAPRM_XATTR, SNAPSHOTS_XATTR, SNAPSHOT_XATTR, SPACE_XATTR, SYNC_XATTR,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Info,
    Sync,
    DropCache,
    Snapshot,
    SnapRm,
    Snapshots,
    Prune,
    Policy,
    Space,
    Reblock,
    Cleanup,
    NoHistory,
    Evict,
    Compression,
    Near,
    Copy,
    History,
    Requests,
    Mirror,
    MirrorRead,
    MirrorWrite,
    MirrorPromote,
    MirrorAttach,
}

impl Control {
    pub const ALL: [Control; 23] = [
        Control::Info,
        Control::Sync,
        Control::DropCache,
        Control::Snapshot,
        Control::SnapRm,
        Control::Snapshots,
        Control::Prune,
        Control::Policy,
        Control::Space,
        Control::Reblock,
        Control::Cleanup,
        Control::NoHistory,
        Control::Evict,
        Control::Compression,
        Control::Near,
        Control::Copy,
        Control::History,
        Control::Requests,
        Control::Mirror,
        Control::MirrorRead,
        Control::MirrorWrite,
        Control::MirrorPromote,
        Control::MirrorAttach,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Control::Info => INFO_XATTR,
            Control::Sync => SYNC_XATTR,
            Control::DropCache => DROPCACHE_XATTR,
            Control::Snapshot => SNAPSHOT_XATTR,
            Control::SnapRm => SNAPRM_XATTR,
            Control::Snapshots => SNAPSHOTS_XATTR,
            Control::Prune => PRUNE_XATTR,
            Control::Policy => POLICY_XATTR,
            Control::Space => SPACE_XATTR,
            Control::Reblock => REBLOCK_XATTR,
            Control::Cleanup => CLEANUP_XATTR,
            Control::NoHistory => NOHISTORY_XATTR,
            Control::Evict => EVICT_XATTR,
            Control::Compression => COMPRESSION_XATTR,
            Control::Near => NEAR_XATTR,
            Control::Copy => COPY_XATTR,
            Control::History => HISTORY_XATTR,
            Control::Requests => REQUESTS_XATTR,
            Control::Mirror => MIRROR_XATTR,
            Control::MirrorRead => MIRROR_READ_XATTR,
            Control::MirrorWrite => MIRROR_WRITE_XATTR,
            Control::MirrorPromote => MIRROR_PROMOTE_XATTR,
            Control::MirrorAttach => MIRROR_ATTACH_XATTR,
        }
    }

    /// The control attribute `name` is, if any.
    pub fn parse(name: &[u8]) -> Option<Control> {
        Control::ALL
            .into_iter()
            .find(|c| c.name().as_bytes() == name)
    }

    /// Settings of one object (any object of the live tree); the rest act on or report
    /// the whole volume and are answered on the mount's root only, except `Info`, which
    /// any object answers (so a command finds the volume from any path in it).
    pub fn per_object(self) -> bool {
        matches!(
            self,
            Control::NoHistory
                | Control::Evict
                | Control::Compression
                | Control::Near
                | Control::Copy
                | Control::History
        )
    }

    /// Whether `ino` (1 = the mount's root) answers this attribute.
    pub fn applies_to(self, ino: u64) -> bool {
        ino == 1 || self.per_object() || self == Control::Info
    }

    pub fn readable(self) -> bool {
        !matches!(
            self,
            Control::Sync
                | Control::DropCache
                | Control::Snapshot
                | Control::SnapRm
                | Control::Near
                | Control::Copy
                | Control::MirrorRead
                | Control::MirrorWrite
                | Control::MirrorPromote
                | Control::MirrorAttach
        )
    }

    pub fn writable(self) -> bool {
        !matches!(
            self,
            Control::Info
                | Control::Snapshots
                | Control::Space
                | Control::History
                | Control::Mirror
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Control;

    #[test]
    fn every_name_parses_to_itself_and_nothing_else_does() {
        for control in Control::ALL {
            assert_eq!(Control::parse(control.name().as_bytes()), Some(control));
            assert!(control.name().starts_with("trusted.anvil."));
        }
        let mut names: Vec<_> = Control::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Control::ALL.len(), "two controls share a name");
        for other in [
            &b"trusted.anvil."[..],
            b"trusted.anvil.info2",
            b"trusted.anvil.INFO",
            b"user.anvil.info",
            b"trusted.anvil.\xff",
            b"",
        ] {
            assert_eq!(Control::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn volume_wide_controls_answer_on_the_root_only() {
        for control in Control::ALL {
            assert!(control.applies_to(1), "{control:?}");
            assert!(
                control.readable() || control.writable(),
                "{control:?} does nothing"
            );
        }
        assert!(!Control::Snapshot.applies_to(5));
        assert!(!Control::Prune.applies_to(5));
        assert!(!Control::Requests.applies_to(5));
        assert!(Control::Info.applies_to(5));
        assert!(Control::NoHistory.applies_to(5));
        assert!(Control::History.applies_to(5));
        assert!(!Control::History.writable());
        assert!(!Control::Sync.readable());
    }
}
