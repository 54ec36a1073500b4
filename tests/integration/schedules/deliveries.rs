//! Which of a schedule's tasks runs which delivery: its crash signal, and what the store
//! showed it. Kept by shuttle's own task ids, not in Tokio's task-locals: shuttle switches
//! tasks inside a poll (at a spawn, for one), and a task switched to there would see the
//! scope a Tokio task-local set for the task it interrupted (a crashed delivery's give-back
//! took its crash, and its snapshots, for the delivery's own).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shuttle::current::{TaskId, me};
use tokio::sync::Notify;

use super::shown::Seen;

/// One delivery's own: the signal its crash gives, what the store showed it.
#[derive(Debug, Default)]
pub(super) struct Delivery {
    pub(super) crash: Notify,
    pub(super) seen: Mutex<Seen>,
}

thread_local! {
    /// The deliveries of the schedule running on this thread (shuttle runs a schedule's tasks
    /// on the thread that runs it), by the task each runs on.
    static DELIVERIES: RefCell<HashMap<TaskId, Arc<Delivery>>> = RefCell::default();
}

/// The calling task's delivery, begun: until the guard is dropped, [`current`] answers it.
pub(super) fn begin() -> Begun {
    let delivery = Arc::new(Delivery::default());
    let task = me();
    DELIVERIES.with(|deliveries| deliveries.borrow_mut().insert(task, Arc::clone(&delivery)));
    Begun { task, delivery }
}

/// Forgets every delivery: a schedule's start (a failed schedule's tasks never end, and
/// shuttle numbers the next one's tasks from the start again).
pub(super) fn forget_all() {
    DELIVERIES.with(|deliveries| deliveries.borrow_mut().clear());
}

/// The delivery the calling task runs, if it runs one (a give-back's task runs none).
pub(super) fn current() -> Option<Arc<Delivery>> {
    let task = me();
    DELIVERIES.with(|deliveries| deliveries.borrow().get(&task).cloned())
}

/// A delivery begun on a task; dropping it ends it there.
#[derive(Debug)]
pub(super) struct Begun {
    task: TaskId,
    pub(super) delivery: Arc<Delivery>,
}

impl Drop for Begun {
    fn drop(&mut self) {
        DELIVERIES.with(|deliveries| deliveries.borrow_mut().remove(&self.task));
    }
}
