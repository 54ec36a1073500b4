//! A transactional handler's effect and outbox event, committed with its settlement; the relay
//! that publishes the event from the stream to a consumer deduplicating on its id, and marks
//! it published (or dies before the mark); the stream that gives a record up; and the sweeper
//! that republishes an event still pending once the stream no longer holds it.

use super::properties::EVENT_ONCE;
use super::state::{Event, Held, State};
use super::{Protocol, Revert};
use crate::effects::{COMPLETION, COMPLETION_EVENTS, event_id};

/// The name of the event the transactional handler adds to its outbox.
const EVENT: &str = "placed";

impl Protocol {
    /// Worker `w`'s settlement committed, and with it its handler's DynamoDB write (one
    /// effect) and outbox event.
    pub(super) fn committed(&self, state: &mut State, w: usize, held: &Held) {
        let op = state.workers[w].op;
        // A crashed attempt's writes never committed, so no re-run is excused: only a new
        // execution's first commit is.
        state.effects[op] += 1;
        if std::mem::take(&mut state.fresh_excuse[op]) {
            state.excused[op] += 1;
        }
        // The execution, as the engine names its events: its first claim's time, which a
        // takeover or an adoption keeps.
        let created_at = held
            .previous
            .as_ref()
            .map_or(held.claim.created_at, |previous| previous.created_at);
        let key = &held.claim.key;
        let id = match self.revert {
            Some(Revert::EventIdWithoutExecution) => {
                key.downstream(&format!("{COMPLETION}#event={EVENT}"))
            }
            _ => event_id(key, created_at, COMPLETION_EVENTS, EVENT),
        };
        state.outbox.push(Event {
            id,
            published: false,
            marked: false,
            in_stream: true,
        });
    }

    /// Event `e`, published, is marked so: out of the pending index, and the stream's
    /// checkpoint moves past it.
    pub(super) fn mark(state: &mut State, e: usize) {
        let event = &mut state.outbox[e];
        event.marked = true;
        event.in_stream = false;
    }

    /// The stream gives event `e`'s record up (its 24 hours passed, or its retries ran out)
    /// before anything marked it.
    pub(super) fn expire(state: &mut State, e: usize) {
        state.outbox[e].in_stream = false;
    }

    /// Whether event `e` may be published now: by the relay while the stream holds it, by the
    /// sweeper once it does not and it is still pending (not with [`Revert::NoSweeper`]); again
    /// only within the bounds' republications.
    pub(super) fn publishable(&self, state: &State, e: usize) -> bool {
        let event = &state.outbox[e];
        let sweeper = self.revert != Some(Revert::NoSweeper);
        let by_someone = event.in_stream || (sweeper && !event.marked);
        by_someone && (!event.published || state.republishes > 0)
    }

    /// The relay publishes outbox event `e`; its consumer acts on an id it has not seen, and
    /// drops one it has. A first publication whose id the consumer has seen is a committed
    /// event that never takes effect.
    pub(super) fn publish(&self, state: &mut State, e: usize) {
        let event = &mut state.outbox[e];
        let first = !event.published;
        event.published = true;
        let id = event.id.clone();
        if !first {
            state.republishes -= 1;
        }
        let seen = state.consumed.contains(&id);
        match (first, seen) {
            (true, true) => state.broken.push(EVENT_ONCE),
            (true, false) => state.consumed.push(id),
            (false, _) => {}
        }
    }
}
