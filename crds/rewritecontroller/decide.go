package rewritecontroller

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/modelrewrite"
)

// Condition types and reasons the reconciler writes. Accepted is upstream's
// condition; its reasons are modelrewrite.Reason values.
const (
	// ConditionAccepted is upstream's primary condition.
	ConditionAccepted = string(v1alpha2.RewriteConditionAccepted)
	// ConditionGuardrailTripped is True while the guardrail diverts a target
	// of the object's rules to its stable target. It is written only once a
	// target of the object has tripped.
	ConditionGuardrailTripped = "GuardrailTripped"
	// ReasonErrorRatioExceeded: a target's error ratio exceeded its stable
	// target's by the guardrail margin.
	ReasonErrorRatioExceeded = "ErrorRatioExceeded"
	// ReasonNoTargetDiverted: every target gets its share (after a clear).
	ReasonNoTargetDiverted = "NoTargetDiverted"
	// maxMessageLen is metav1.Condition's limit on Message.
	maxMessageLen = 32768
)

// owns reports whether obj belongs to pool: its poolRef names the pool's
// group (defaulted) and name. Whether the ref's kind is valid is validation's
// concern, so a bad kind on our pool's name is reported, not ignored.
func owns(pool modelrewrite.PoolKey, obj *v1alpha2.InferenceModelRewrite) bool {
	ref := obj.Spec.PoolRef
	return obj.Namespace == pool.Namespace && ref != nil && string(ref.Name) == pool.Name &&
		cmp.Or(string(ref.Group), modelrewrite.DefaultPoolGroup) == pool.Group
}

// verdict is the status one object should have.
type verdict struct {
	obj        *v1alpha2.InferenceModelRewrite
	conditions []metav1.Condition
}

// decide computes, from the pool's objects, whether the pool exists and the
// guardrail's current trips, the Table in force (nil when no object is
// accepted) and each object's status.
// Objects of other pools and objects being deleted are left out. It only
// reads objs.
func decide(pool modelrewrite.PoolKey, objs []v1alpha2.InferenceModelRewrite, poolFound bool, trips []modelrewrite.Trip) (*modelrewrite.Table, []verdict, error) {
	poolExists := func(k modelrewrite.PoolKey) bool { return poolFound && k == pool }
	tripsOf := map[modelrewrite.ObjectKey][]modelrewrite.Trip{}
	for _, t := range trips {
		tripsOf[t.Rule.Object] = append(tripsOf[t.Rule.Object], t)
	}
	var (
		rewrites []modelrewrite.Rewrite
		verdicts []verdict
		errs     []error
	)
	for i := range objs {
		obj := &objs[i]
		if obj.DeletionTimestamp != nil || !owns(pool, obj) {
			continue
		}
		accepted, reason, message := Validate(obj, poolExists)
		status := metav1.ConditionFalse
		if accepted {
			rw, err := FromAPI(obj)
			if err != nil { // Validate accepted it, so this is a bug: say so, keep the rest.
				errs = append(errs, err)
				accepted, reason, message = false, modelrewrite.ReasonPending, err.Error()
			} else {
				status = metav1.ConditionTrue
				rewrites = append(rewrites, rw)
			}
		}
		v := verdict{obj: obj, conditions: []metav1.Condition{{
			Type: ConditionAccepted, Status: status, Reason: string(reason),
			Message: truncate(message), ObservedGeneration: obj.Generation,
		}}}
		key := modelrewrite.ObjectKey{Namespace: obj.Namespace, Name: obj.Name}
		if ts := tripsOf[key]; len(ts) > 0 {
			v.conditions = append(v.conditions, metav1.Condition{
				Type: ConditionGuardrailTripped, Status: metav1.ConditionTrue, Reason: ReasonErrorRatioExceeded,
				Message: truncate(tripMessage(obj.Namespace, obj.Name, ts)), ObservedGeneration: obj.Generation,
			})
		} else if meta.FindStatusCondition(obj.Status.Conditions, ConditionGuardrailTripped) != nil {
			v.conditions = append(v.conditions, metav1.Condition{
				Type: ConditionGuardrailTripped, Status: metav1.ConditionFalse, Reason: ReasonNoTargetDiverted,
				Message: "every target gets its weighted share", ObservedGeneration: obj.Generation,
			})
		}
		verdicts = append(verdicts, v)
	}
	if len(rewrites) == 0 {
		// No rules: a nil Table lets model selection skip parsing bodies.
		return nil, verdicts, errors.Join(errs...)
	}
	table, err := modelrewrite.NewTable(rewrites)
	return table, verdicts, errors.Join(append(errs, err)...)
}

// tripMessage says which targets are diverted, why, and how to clear them.
func tripMessage(namespace, name string, trips []modelrewrite.Trip) string {
	var b strings.Builder
	for i, t := range trips {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "rules[%d] target %q: error ratio %.3f over %d requests vs %.3f over %d for stable target %q since %s; its share goes to %q",
			t.Rule.Index, t.Target, t.TargetErrorRatio, t.TargetRequests, t.StableErrorRatio, t.StableRequests, t.Stable,
			t.Since.UTC().Format("2006-01-02T15:04:05Z"), t.Stable)
	}
	fmt.Fprintf(&b, ". To clear: kubectl annotate -n %s inferencemodelrewrite %s %s=\"$(date +%%s)\" --overwrite",
		namespace, name, modelrewrite.ClearGuardrailAnnotation)
	return b.String()
}

func truncate(s string) string {
	if len(s) <= maxMessageLen {
		return s
	}
	const ellipsis = "..."
	cut := maxMessageLen - len(ellipsis)
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + ellipsis
}
