package crds

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is Sluice's API group.
const GroupName = "sluice.dev"

// GroupVersion is the group and version of every type in this package.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

// AddToScheme registers this package's types with a scheme.
var AddToScheme = schemeBuilder.AddToScheme

// Install is AddToScheme under the name newer Kubernetes API packages use.
var Install = schemeBuilder.AddToScheme

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &FlowControlPolicy{}, &FlowControlPolicyList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
