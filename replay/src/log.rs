//! The replay's state machine and log position, as the engine reads them: every command is
//! applied as a committed entry, counted, and the last one that did more than submit jobs noted
//! (`StateHandle::last_change_index` in corrald).

use std::cell::RefCell;

use corral_state::view::ViewCache;
use corral_state::ClusterState;
use engine::StateReader;
use proto::{Command, CommandResult, JobId};

#[derive(Default)]
pub(crate) struct Log {
    pub(crate) state: ClusterState,
    /// Commands applied so far (the log's last index).
    pub(crate) applied: u64,
    last_change: u64,
    cache: RefCell<ViewCache>,
}

impl Log {
    pub(crate) fn apply(&mut self, cmd: &Command) -> CommandResult {
        self.applied += 1;
        if !cmd.submits_only() {
            self.last_change = self.applied;
        }
        self.state.apply(cmd)
    }
}

impl StateReader for Log {
    fn applied_index(&self) -> u64 {
        self.applied
    }

    fn with_state<R>(&self, f: impl FnOnce(&ClusterState, u64) -> R) -> R {
        f(&self.state, self.last_change)
    }

    fn view(&self) -> (scheduler::ClusterView, JobId) {
        let view = corral_state::view::scheduler_view_cached(&self.state, &mut self.cache.borrow_mut(), |_| None);
        (view, self.state.next_job_id)
    }
}
