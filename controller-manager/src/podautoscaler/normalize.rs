//! From the metrics' proposal to the replica count the controller sets
//! (`horizontal.go`'s `normalizeDesiredReplicas*`): stabilization windows over recent
//! recommendations, the scale-rate policies of `spec.behavior` (or the fixed limits when
//! there is none), and `minReplicas`/`maxReplicas`, with the `AbleToScale` and
//! `ScalingLimited` conditions they imply. Pure: the per-HPA [`History`] and the clock are
//! passed in.

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What the controller remembers of one HPA between syncs (upstream keeps the same in memory).
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Unstabilized recommendations, newest last.
    pub recommendations: Vec<(Timestamp, i32)>,
    /// Replicas added by each scale-up, and removed by each scale-down.
    pub scale_up_events: Vec<(Timestamp, i32)>,
    pub scale_down_events: Vec<(Timestamp, i32)>,
}

/// A condition to set: (status is True, reason, message).
pub type Cond = (bool, &'static str, &'static str);

#[derive(Clone, Debug, PartialEq)]
pub struct Normalized {
    pub replicas: i32,
    pub able_to_scale: Cond,
    pub scaling_limited: Cond,
}

const READY_FOR_NEW_SCALE: Cond = (true, "ReadyForNewScale", "recommended size matches current size");
const DOWN_STABILIZED: Cond = (
    true,
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const UP_STABILIZED: Cond = (
    true,
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const WITHIN_RANGE: (&str, &str) = ("DesiredWithinRange", "the desired count is within the acceptable range");
const TOO_FEW: (&str, &str) = ("TooFewReplicas", "the desired replica count is less than the minimum replica count");
const TOO_MANY: (&str, &str) = ("TooManyReplicas", "the desired replica count is more than the maximum replica count");
const UP_LIMIT: (&str, &str) =
    ("ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate");
const DOWN_LIMIT: (&str, &str) =
    ("ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate");

/// The HPA's bounds and the two counts being reconciled.
#[derive(Clone, Copy, Debug)]
pub struct Args {
    pub min: i32,
    pub max: i32,
    pub current: i32,
    pub desired: i32,
}

fn limited(replicas: i32, stabilized: i32, (reason, message): (&'static str, &'static str)) -> Cond {
    (replicas != stabilized, reason, message)
}

/// Without `spec.behavior`: the highest recommendation of the last `down_window`, then at
/// most `max(2 × current, 4)` and within min..max.
pub fn without_behavior(h: &mut History, a: Args, down_window: SignedDuration, now: Timestamp) -> Normalized {
    let cutoff = now - down_window;
    h.recommendations.retain(|(t, _)| *t > cutoff);
    let stabilized = h.recommendations.iter().map(|(_, r)| *r).fold(a.desired, i32::max);
    h.recommendations.push((now, a.desired));
    let able_to_scale = if stabilized != a.desired { DOWN_STABILIZED } else { READY_FOR_NEW_SCALE };
    let scale_up_limit = (2 * a.current).max(4);
    let (minimum, too_few) =
        if a.min == 0 { (1, ("TooFewReplicas", "the desired replica count is zero")) } else { (a.min, TOO_FEW) };
    let (replicas, why) = if stabilized < minimum {
        (minimum, too_few)
    } else {
        let (maximum, why) = if a.max > scale_up_limit { (scale_up_limit, UP_LIMIT) } else { (a.max, TOO_MANY) };
        if stabilized > maximum {
            (maximum, why)
        } else {
            (stabilized, WITHIN_RANGE)
        }
    };
    Normalized { replicas, able_to_scale, scaling_limited: limited(replicas, stabilized, why) }
}

/// The scale-up rules when `spec.behavior.scaleUp` leaves them out (`GenerateHPAScaleUpRules`).
fn up_rules(b: &HorizontalPodAutoscalerBehavior) -> Rules {
    let r = b.scale_up.clone().unwrap_or_default();
    Rules {
        window: r.stabilization_window_seconds.unwrap_or(0),
        select: r.select_policy.clone().unwrap_or_else(|| "Max".into()),
        policies: policies(&r, &[("Pods", 4, 15), ("Percent", 100, 15)]),
    }
}

/// The scale-down rules (`GenerateHPAScaleDownRules`); an unset window is the
/// controller's `--horizontal-pod-autoscaler-downscale-stabilization`.
fn down_rules(b: &HorizontalPodAutoscalerBehavior, default_window: SignedDuration) -> Rules {
    let r = b.scale_down.clone().unwrap_or_default();
    Rules {
        window: r.stabilization_window_seconds.unwrap_or(default_window.as_secs() as i32),
        select: r.select_policy.clone().unwrap_or_else(|| "Max".into()),
        policies: policies(&r, &[("Percent", 100, 15)]),
    }
}

fn policies(r: &HPAScalingRules, default: &[(&str, i32, i32)]) -> Vec<(String, i32, i32)> {
    match &r.policies {
        Some(p) if !p.is_empty() => p.iter().map(|p| (p.type_.clone(), p.value, p.period_seconds)).collect(),
        _ => default.iter().map(|(t, v, p)| (t.to_string(), *v, *p)).collect(),
    }
}

struct Rules {
    window: i32,
    select: String,
    /// (type, value, periodSeconds)
    policies: Vec<(String, i32, i32)>,
}

fn changes_within(events: &[(Timestamp, i32)], period: i32, now: Timestamp) -> i32 {
    let cutoff = now - SignedDuration::from_secs(period as i64);
    events.iter().filter(|(t, _)| *t > cutoff).map(|(_, c)| *c).sum()
}

/// `calculateScaleUpLimitWithScalingRules`.
fn scale_up_limit(h: &History, current: i32, r: &Rules, now: Timestamp) -> i32 {
    if r.select == "Disabled" {
        return current;
    }
    let proposals = r.policies.iter().map(|(kind, value, period)| {
        let start = current - changes_within(&h.scale_up_events, *period, now)
            + changes_within(&h.scale_down_events, *period, now);
        if kind == "Pods" {
            start + value
        } else {
            (start as f64 * (1.0 + *value as f64 / 100.0)).ceil() as i32
        }
    });
    if r.select == "Min" {
        proposals.min().unwrap_or(current)
    } else {
        proposals.max().unwrap_or(current)
    }
}

/// `calculateScaleDownLimitWithBehaviors`: `Max` picks the policy that allows removing
/// the most pods (the lowest count).
fn scale_down_limit(h: &History, current: i32, r: &Rules, now: Timestamp) -> i32 {
    if r.select == "Disabled" {
        return current;
    }
    let proposals = r.policies.iter().map(|(kind, value, period)| {
        let start = current - changes_within(&h.scale_up_events, *period, now)
            + changes_within(&h.scale_down_events, *period, now);
        if kind == "Pods" {
            start - value
        } else {
            (start as f64 * (1.0 - *value as f64 / 100.0)) as i32
        }
    });
    if r.select == "Min" {
        proposals.max().unwrap_or(current)
    } else {
        proposals.min().unwrap_or(current)
    }
}

/// With `spec.behavior`: stabilize between the lowest recommendation of the scale-up
/// window and the highest of the scale-down window, then apply the rate policies and
/// min..max.
pub fn with_behavior(
    h: &mut History,
    b: &HorizontalPodAutoscalerBehavior,
    a: Args,
    default_down_window: SignedDuration,
    now: Timestamp,
) -> Normalized {
    let up = up_rules(b);
    let down = down_rules(b, default_down_window);
    let up_cutoff = now - SignedDuration::from_secs(up.window as i64);
    let down_cutoff = now - SignedDuration::from_secs(down.window as i64);
    let (mut up_rec, mut down_rec) = (a.desired, a.desired);
    for (t, r) in &h.recommendations {
        if *t > up_cutoff {
            up_rec = up_rec.min(*r);
        }
        if *t > down_cutoff {
            down_rec = down_rec.max(*r);
        }
    }
    let stabilized = a.current.max(up_rec).min(down_rec);
    let oldest = up_cutoff.min(down_cutoff);
    h.recommendations.retain(|(t, _)| *t > oldest);
    h.recommendations.push((now, a.desired));
    let able_to_scale = if stabilized == a.desired {
        READY_FOR_NEW_SCALE
    } else if a.desired >= a.current {
        UP_STABILIZED
    } else {
        DOWN_STABILIZED
    };

    let (replicas, why) = if stabilized > a.current {
        let limit = scale_up_limit(h, a.current, &up, now).max(a.current);
        let (maximum, why) = if a.max > limit { (limit, UP_LIMIT) } else { (a.max, TOO_MANY) };
        if stabilized > maximum {
            (maximum, why)
        } else {
            (stabilized, WITHIN_RANGE)
        }
    } else if stabilized < a.current {
        let limit = scale_down_limit(h, a.current, &down, now).min(a.current);
        let (minimum, why) = if a.min < limit { (limit, DOWN_LIMIT) } else { (a.min, TOO_FEW) };
        if stabilized < minimum {
            (minimum, why)
        } else {
            (stabilized, WITHIN_RANGE)
        }
    } else {
        (stabilized, WITHIN_RANGE)
    };
    Normalized { replicas, able_to_scale, scaling_limited: limited(replicas, stabilized, why) }
}

/// Remember a rescale for the rate policies (`storeScaleEvent`); events older than the
/// longest policy period are dropped. Without `behavior` nothing is kept.
pub fn record_rescale(
    h: &mut History,
    b: Option<&HorizontalPodAutoscalerBehavior>,
    previous: i32,
    new: i32,
    now: Timestamp,
) {
    let Some(b) = b else { return };
    let longest = |r: &Rules| r.policies.iter().map(|p| p.2).max().unwrap_or(0);
    let up_keep = now - SignedDuration::from_secs(longest(&up_rules(b)) as i64);
    let down_keep = now - SignedDuration::from_secs(longest(&down_rules(b, SignedDuration::ZERO)) as i64);
    h.scale_up_events.retain(|(t, _)| *t > up_keep);
    h.scale_down_events.retain(|(t, _)| *t > down_keep);
    if new > previous {
        h.scale_up_events.push((now, new - previous));
    } else if new < previous {
        h.scale_down_events.push((now, previous - new));
    }
}

#[cfg(test)]
mod tests {
    //! Cases from upstream's `horizontal_test.go` normalization tables, as facts.
    use super::*;
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }
    const FIVE_MIN: SignedDuration = SignedDuration::from_secs(300);

    fn args(min: i32, max: i32, current: i32, desired: i32) -> Args {
        Args { min, max, current, desired }
    }

    fn rules(window: Option<i32>, select: Option<&str>, policies: &[(&str, i32, i32)]) -> HPAScalingRules {
        HPAScalingRules {
            stabilization_window_seconds: window,
            select_policy: select.map(String::from),
            policies: Some(
                policies
                    .iter()
                    .map(|(k, v, p)| HPAScalingPolicy { type_: k.to_string(), value: *v, period_seconds: *p })
                    .collect(),
            ),
            tolerance: None,
        }
    }

    #[test]
    fn no_behavior_limits() {
        let mut h = History::default();
        // Scale-up rate: at most max(2×current, 4).
        let n = without_behavior(&mut h, args(1, 100, 3, 20), FIVE_MIN, t(0));
        assert_eq!(n.replicas, 6);
        assert_eq!(n.scaling_limited, (true, "ScaleUpLimit", UP_LIMIT.1));
        let mut h = History::default();
        assert_eq!(without_behavior(&mut h, args(1, 100, 1, 20), FIVE_MIN, t(0)).replicas, 4);
        // maxReplicas.
        let mut h = History::default();
        let n = without_behavior(&mut h, args(1, 5, 4, 8), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited.1), (5, "TooManyReplicas"));
        // minReplicas.
        let mut h = History::default();
        let n = without_behavior(&mut h, args(2, 5, 3, 1), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited), (2, (true, "TooFewReplicas", TOO_FEW.1)));
        let n = without_behavior(&mut History::default(), args(1, 5, 3, 3), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited.0, n.able_to_scale), (3, false, READY_FOR_NEW_SCALE));
    }

    #[test]
    fn no_behavior_scale_down_is_stabilized_for_the_window() {
        let mut h = History::default();
        assert_eq!(without_behavior(&mut h, args(1, 10, 5, 5), FIVE_MIN, t(0)).replicas, 5);
        // Load drops: the recommendation of 5 a minute ago still holds.
        let n = without_behavior(&mut h, args(1, 10, 5, 2), FIVE_MIN, t(60));
        assert_eq!((n.replicas, n.able_to_scale), (5, DOWN_STABILIZED));
        // After the window, the highest recommendation left is 2.
        assert_eq!(without_behavior(&mut h, args(1, 10, 5, 2), FIVE_MIN, t(301)).replicas, 2);
        // Scale-up is never held back by the window.
        assert_eq!(without_behavior(&mut h, args(1, 10, 2, 4), FIVE_MIN, t(302)).replicas, 4);
    }

    #[test]
    fn behavior_defaults() {
        // Default scale-up: max of +4 pods and +100% per 15 s.
        let b = HorizontalPodAutoscalerBehavior::default();
        let mut h = History::default();
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 10, 50), FIVE_MIN, t(0)).replicas, 20);
        let mut h = History::default();
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 1, 50), FIVE_MIN, t(0)).replicas, 5);
        // Default scale-down: stabilized for 5 minutes, then up to 100% at once.
        let mut h = History::default();
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 10, 10), FIVE_MIN, t(0)).replicas, 10);
        let n = with_behavior(&mut h, &b, args(1, 100, 10, 1), FIVE_MIN, t(100));
        assert_eq!((n.replicas, n.able_to_scale), (10, DOWN_STABILIZED));
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 10, 1), FIVE_MIN, t(400)).replicas, 1);
    }

    #[test]
    fn scale_up_stabilization_takes_the_lowest_recent_recommendation() {
        let b = HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(Some(60), None, &[("Pods", 100, 15)])),
            ..Default::default()
        };
        let mut h = History::default();
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 3, 3), FIVE_MIN, t(0)).replicas, 3);
        let n = with_behavior(&mut h, &b, args(1, 100, 3, 9), FIVE_MIN, t(30));
        assert_eq!((n.replicas, n.able_to_scale), (3, UP_STABILIZED));
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 3, 9), FIVE_MIN, t(61)).replicas, 9);
    }

    #[test]
    fn rate_policies_count_recent_scale_events() {
        let b = HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(Some(0), Some("Max"), &[("Pods", 2, 60)])),
            scale_down: Some(rules(Some(0), Some("Max"), &[("Percent", 50, 60), ("Pods", 1, 60)])),
        };
        let mut h = History::default();
        // +2 pods per minute.
        let n = with_behavior(&mut h, &b, args(1, 100, 4, 10), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited.1), (6, "ScaleUpLimit"));
        record_rescale(&mut h, Some(&b), 4, 6, t(0));
        // Half a minute later the budget is spent: the period started at 4.
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 6, 10), FIVE_MIN, t(30)).replicas, 6);
        assert_eq!(with_behavior(&mut h, &b, args(1, 100, 6, 10), FIVE_MIN, t(61)).replicas, 8);
        // Scale-down, Max: the policy that removes the most (50% of 8 = 4 → 4).
        let mut h = History::default();
        let n = with_behavior(&mut h, &b, args(1, 100, 8, 1), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited.1), (4, "ScaleDownLimit"));
        // Min: the policy that removes the fewest (1 pod).
        let b_min = HorizontalPodAutoscalerBehavior {
            scale_down: Some(rules(Some(0), Some("Min"), &[("Percent", 50, 60), ("Pods", 1, 60)])),
            ..b.clone()
        };
        assert_eq!(with_behavior(&mut History::default(), &b_min, args(1, 100, 8, 1), FIVE_MIN, t(0)).replicas, 7);
        // Disabled: no scale-down at all.
        let off = HorizontalPodAutoscalerBehavior {
            scale_down: Some(rules(Some(0), Some("Disabled"), &[("Pods", 1, 60)])),
            ..b.clone()
        };
        assert_eq!(with_behavior(&mut History::default(), &off, args(1, 100, 8, 1), FIVE_MIN, t(0)).replicas, 8);
        // minReplicas below the rate limit.
        let n = with_behavior(&mut History::default(), &b, args(6, 100, 8, 1), FIVE_MIN, t(0));
        assert_eq!((n.replicas, n.scaling_limited.1), (6, "TooFewReplicas"));
    }
}
