//go:build dra_v037

package main

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// decode with the v0.37 reader: it says which version it took and validates that object.
func decode(dec *json.Decoder, md *metadata.DeviceMetadata) (string, string, error) {
	var invalid error
	var gvk schema.GroupVersionKind
	err := devicemetadata.DecodeMetadataFromStream(dec, md,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid),
		devicemetadata.DecodeMetadataStoreGVKResult(&gvk))
	verdict := "valid"
	if invalid != nil {
		verdict = invalid.Error()
	}
	return gvk.GroupVersion().String(), verdict, err
}
