//! Calls that one call can carry for several callers. A coalesced request (`client.rs`) sends
//! the calls that name the same [`Merge`] as one call, and hands each caller its own part of
//! that call's answer.
//!
//! Why: the verify lens's code goes to the node with every `eth_call` (a state override), and
//! the node's work is mostly taking that code in, not running it. Verifies that are ready at
//! the same moment read their facts in one call, so the node takes the code in once for them.

use std::fmt::Debug;

use super::client::{Call, CallResult};
use serde_json::Value;

/// How calls of one kind go together. Implemented by the room that writes the calls (the
/// verify lens): this room only groups them and hands the answers back.
pub trait Merge: Debug + Send + Sync {
    /// The one call that carries `calls`, in order; `None` when they cannot go together (a
    /// call shaped otherwise than this kind writes them): each is then sent as it is.
    fn merge(&self, calls: &[&Call]) -> Option<Call>;
    /// What each of `count` merged calls would have been answered on its own, in order, from
    /// `answer`, the merged call's.
    fn split(&self, answer: &Value, count: usize) -> Vec<CallResult>;
}

/// Most calls one merged call carries: a bound on the gas of one `eth_call`, whatever the
/// node's cap on it.
pub const MAX_MERGED: usize = 16;

/// What is sent for a list of calls, and where each call's answer comes from.
pub struct Plan {
    /// The calls to send: the calls that merge with nothing as they are, one call per merge.
    pub sent: Vec<Call>,
    /// For each call asked, in order: where its answer is.
    sources: Vec<Source>,
    /// The calls each merged call carries, kept to be sent one by one if it fails as a whole.
    merged: Vec<Merged>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    /// `sent[i]` is this call.
    Alone(usize),
    /// Part `part` of `merged[group]`.
    Merged { group: usize, part: usize },
}

/// A call and its position among the calls asked.
type Numbered = (usize, Call);

struct Merged {
    /// Its position in `sent`.
    sent: usize,
    merge: &'static dyn Merge,
    calls: Vec<Call>,
}

/// Where one asked call's answer ends up: given, or to be asked again on its own (its merged
/// call failed as a whole, which says nothing of this call).
pub enum Part {
    Answered(CallResult),
    Again(Call),
}

impl Plan {
    /// Groups the calls of each `Merge` (at most [`MAX_MERGED`] a group, in order).
    pub fn new(calls: Vec<Call>) -> Plan {
        let mut groups: Vec<(&'static dyn Merge, Vec<Numbered>)> = Vec::new();
        let mut alone: Vec<Numbered> = Vec::new();
        let count = calls.len();
        for (index, call) in calls.into_iter().enumerate() {
            let Some(merge) = call.merge else {
                alone.push((index, call));
                continue;
            };
            match groups
                .iter_mut()
                .find(|(m, members)| same(*m, merge) && members.len() < MAX_MERGED)
            {
                Some((_, members)) => members.push((index, call)),
                None => groups.push((merge, vec![(index, call)])),
            }
        }
        let mut plan = Plan {
            sent: Vec::with_capacity(count),
            sources: vec![Source::Alone(0); count],
            merged: Vec::new(),
        };
        for (index, call) in alone {
            plan.send_alone(index, call);
        }
        for (merge, members) in groups {
            plan.send_merged(merge, members);
        }
        plan
    }

    fn send_alone(&mut self, index: usize, call: Call) {
        self.sources[index] = Source::Alone(self.sent.len());
        self.sent.push(call);
    }

    fn send_merged(&mut self, merge: &'static dyn Merge, members: Vec<Numbered>) {
        let one = match members.len() {
            1 => None,
            _ => merge.merge(&members.iter().map(|(_, c)| c).collect::<Vec<_>>()),
        };
        let Some(one) = one else {
            for (index, call) in members {
                self.send_alone(index, call);
            }
            return;
        };
        let group = self.merged.len();
        let (indices, calls): (Vec<usize>, Vec<Call>) = members.into_iter().unzip();
        for (part, index) in indices.into_iter().enumerate() {
            self.sources[index] = Source::Merged { group, part };
        }
        self.merged.push(Merged {
            sent: self.sent.len(),
            merge,
            calls,
        });
        self.sent.push(one);
    }

    /// Each asked call's part, in order, from the answers to `sent`.
    pub fn parts(self, answers: Vec<CallResult>) -> Vec<Part> {
        let mut split: Vec<Option<Vec<CallResult>>> = self
            .merged
            .iter()
            .map(|m| match &answers[m.sent] {
                Ok(answer) => Some(m.merge.split(answer, m.calls.len())),
                Err(_) => None,
            })
            .collect();
        let mut calls: Vec<Vec<Option<Call>>> = self
            .merged
            .into_iter()
            .map(|m| m.calls.into_iter().map(Some).collect())
            .collect();
        let mut answers: Vec<Option<CallResult>> = answers.into_iter().map(Some).collect();
        self.sources
            .into_iter()
            .map(|source| match source {
                Source::Alone(i) => Part::Answered(answers[i].take().expect("each answer once")),
                Source::Merged { group, part } => match &mut split[group] {
                    Some(parts) => {
                        Part::Answered(std::mem::replace(&mut parts[part], Ok(Value::Null)))
                    }
                    None => Part::Again(calls[group][part].take().expect("each call once")),
                },
            })
            .collect()
    }
}

fn same(a: &'static dyn Merge, b: &'static dyn Merge) -> bool {
    std::ptr::addr_eq(a as *const dyn Merge, b as *const dyn Merge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::RpcError;
    use serde_json::json;

    /// Merges calls by listing their first params; splits an array answer back.
    #[derive(Debug)]
    struct Listing;

    impl Merge for Listing {
        fn merge(&self, calls: &[&Call]) -> Option<Call> {
            let params = calls.iter().map(|c| c.params[0].clone()).collect();
            Some(Call::new("list", vec![Value::Array(params)]))
        }
        fn split(&self, answer: &Value, count: usize) -> Vec<CallResult> {
            let parts = answer.as_array().cloned().unwrap_or_default();
            (0..count).map(|i| Ok(parts[i].clone())).collect()
        }
    }

    static LISTING: Listing = Listing;

    fn mergeable(n: u64) -> Call {
        let mut call = Call::new("read", vec![json!(n)]);
        call.merge = Some(&LISTING);
        call
    }

    fn answered(part: Part) -> CallResult {
        match part {
            Part::Answered(answer) => answer,
            Part::Again(call) => panic!("{} asked again", call.method),
        }
    }

    #[test]
    fn mergeable_calls_go_as_one_and_each_gets_its_part() {
        let calls = vec![mergeable(1), Call::new("plain", vec![]), mergeable(2)];
        let plan = Plan::new(calls);
        assert_eq!(plan.sent.len(), 2);
        assert_eq!(plan.sent[0].method, "plain");
        assert_eq!(plan.sent[1].params, vec![json!([1, 2])]);
        let parts = plan.parts(vec![Ok(json!("p")), Ok(json!(["one", "two"]))]);
        let parts: Vec<_> = parts.into_iter().map(answered).collect();
        assert_eq!(
            parts,
            vec![Ok(json!("one")), Ok(json!("p")), Ok(json!("two"))]
        );
    }

    #[test]
    fn a_lone_mergeable_call_goes_as_it_is() {
        let plan = Plan::new(vec![mergeable(7)]);
        assert_eq!(plan.sent.len(), 1);
        assert_eq!(plan.sent[0].method, "read");
        let parts = plan.parts(vec![Ok(json!(7))]);
        assert_eq!(answered(parts.into_iter().next().unwrap()), Ok(json!(7)));
    }

    #[test]
    fn a_merged_call_that_fails_has_its_calls_asked_again() {
        let plan = Plan::new(vec![mergeable(1), mergeable(2)]);
        let failed = RpcError {
            code: -32000,
            message: "gas cap exceeded".into(),
            data: None,
        };
        let parts = plan.parts(vec![Err(failed)]);
        let again: Vec<Value> = parts
            .into_iter()
            .map(|p| match p {
                Part::Again(call) => call.params[0].clone(),
                Part::Answered(_) => panic!("answered"),
            })
            .collect();
        assert_eq!(again, vec![json!(1), json!(2)]);
    }

    #[test]
    fn groups_hold_at_most_max_merged_calls() {
        let calls = (0..MAX_MERGED as u64 + 1).map(mergeable).collect();
        let plan = Plan::new(calls);
        // One full merged call, and the one left over as it is.
        assert_eq!(plan.sent.len(), 2);
        assert_eq!(plan.sent[0].method, "list");
        assert_eq!(plan.sent[1].method, "read");
    }
}
