//go:build !dra_v037

package main

import (
	"encoding/json"

	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// decode with the v0.36 reader: the first version it knows (v1alpha1; it skips v1beta1), no
// validation and no word of which version it took.
func decode(dec *json.Decoder, md *metadata.DeviceMetadata) (string, string, error) {
	return "", "", devicemetadata.DecodeMetadataFromStream(dec, md)
}
