// Command metadatareader decodes a DRA device metadata file (KEP-5304) with upstream's own reader,
// k8s.io/dynamic-resource-allocation/devicemetadata, as a workload in a container would, and
// prints what it understood as one JSON object: the test peer of Patchbay's metadata writer
// (tests/conformance/test_device_metadata_conformance.py). Built against one library release by
// hack/go-peer.sh (tests/support/gopeer.py); check_v036.go or, with the build tag dra_v037,
// check_v037.go adds what only some releases have (the v0.37 decoder validates).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

type device struct {
	Driver     string         `json:"driver"`
	Pool       string         `json:"pool"`
	Name       string         `json:"name"`
	Attributes map[string]any `json:"attributes"`
}

type request struct {
	Name    string   `json:"name"`
	Devices []device `json:"devices"`
}

type result struct {
	Namespace    string    `json:"namespace"`
	Name         string    `json:"name"`
	UID          string    `json:"uid"`
	Generation   int64     `json:"generation"`
	PodClaimName *string   `json:"podClaimName"`
	Requests     []request `json:"requests"`
	// What only some library releases tell: the version decoded, the validation's verdict.
	Decoded    string `json:"decoded"`
	Validation string `json:"validation"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: metadatareader <metadata.json>")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	var md metadata.DeviceMetadata
	decoded, validation, err := decode(json.NewDecoder(bufio.NewReader(f)), &md)
	if err != nil {
		fmt.Fprintln(os.Stderr, "decode:", err)
		os.Exit(1)
	}
	out := result{
		Namespace: md.Namespace, Name: md.Name, UID: string(md.UID), Generation: md.Generation,
		PodClaimName: md.PodClaimName, Decoded: decoded, Validation: validation,
	}
	for _, r := range md.Requests {
		req := request{Name: r.Name, Devices: []device{}}
		for _, d := range r.Devices {
			attrs := map[string]any{}
			for k, v := range d.Attributes {
				attrs[string(k)] = v
			}
			req.Devices = append(req.Devices, device{Driver: d.Driver, Pool: d.Pool, Name: d.Name, Attributes: attrs})
		}
		out.Requests = append(out.Requests, req)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

var _ = devicemetadata.DecodeMetadataFromStream
