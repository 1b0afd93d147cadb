// Prints what k8s.io/apimachinery (the API server's own code) says of quantities and label
// selectors, as JSON: the tables tests/unit/api/test_api_quantity.py and test_api_selectors.py
// hold patchbay_api to. Run offline from the module cache that hack/kube-binaries.sh fills:
//
//	cd hack/apimachinery-cases && GOFLAGS=-mod=mod GOPROXY=off go run . < cases.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func main() {
	var in struct {
		Quantities []string `json:"quantities"`
		Selectors  []struct {
			Selector *metav1.LabelSelector `json:"selector"`
			Labels   map[string]string     `json:"labels"`
		} `json:"selectors"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		panic(err)
	}
	type q struct {
		In        string `json:"in"`
		Error     bool   `json:"error"`
		Canonical string `json:"canonical,omitempty"`
		Value     int64  `json:"value"`
		Milli     int64  `json:"milli"`
	}
	type s struct {
		Selector *metav1.LabelSelector `json:"selector"`
		Labels   map[string]string     `json:"labels"`
		Error    bool                  `json:"error"`
		Matches  bool                  `json:"matches"`
	}
	out := struct {
		Quantities []q `json:"quantities"`
		Selectors  []s `json:"selectors"`
	}{}
	for _, str := range in.Quantities {
		parsed, err := resource.ParseQuantity(str)
		if err != nil {
			out.Quantities = append(out.Quantities, q{In: str, Error: true})
			continue
		}
		out.Quantities = append(out.Quantities, q{In: str, Canonical: parsed.String(), Value: parsed.Value(), Milli: parsed.MilliValue()})
	}
	for _, c := range in.Selectors {
		sel, err := metav1.LabelSelectorAsSelector(c.Selector)
		if err != nil {
			out.Selectors = append(out.Selectors, s{Selector: c.Selector, Labels: c.Labels, Error: true})
			continue
		}
		out.Selectors = append(out.Selectors, s{Selector: c.Selector, Labels: c.Labels, Matches: sel.Matches(labels.Set(c.Labels))})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
