package xds

import (
	"encoding/json"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// defaultInstanceIP is the node IP reported when INSTANCE_IP is unset
// (SPEC §5.2).
const defaultInstanceIP = "1.1.1.1"

// NodeInfo is what the xDS node identity is built from (SPEC §5.2). cmd/gozt
// fills it from the environment.
type NodeInfo struct {
	InstanceIP   string // INSTANCE_IP; "" means 1.1.1.1
	PodName      string // POD_NAME
	PodNamespace string // POD_NAMESPACE
	NodeName     string // NODE_NAME
	// Meta is the proxy metadata: ISTIO_META_* variables with the prefix
	// stripped, and ProxyConfig.proxyMetadata. Sent as string values; an
	// entry overrides a built-in key of the same name. Or nil.
	Meta map[string]string
	// MetaJSON holds ISTIO_METAJSON_* values (prefix stripped), already
	// parsed from JSON (as encoding/json produces: map[string]any, []any,
	// string, float64 or json.Number, bool, nil). It overrides Meta. Or nil.
	MetaJSON map[string]any
}

// BuildNode returns the Node sent on every initial xDS request:
//
//	id       = "ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local"
//	metadata = NAME, NAMESPACE, INSTANCE_IPS, NODE_NAME, then Meta, then
//	           MetaJSON
//
// Node.cluster is left empty, as ztunnel does.
func BuildNode(info NodeInfo) *corev3.Node {
	ip := info.InstanceIP
	if ip == "" {
		ip = defaultInstanceIP
	}
	fields := map[string]*structpb.Value{
		"NAME":         structpb.NewStringValue(info.PodName),
		"NAMESPACE":    structpb.NewStringValue(info.PodNamespace),
		"INSTANCE_IPS": structpb.NewStringValue(ip),
		"NODE_NAME":    structpb.NewStringValue(info.NodeName),
	}
	for k, v := range info.Meta {
		fields[k] = structpb.NewStringValue(v)
	}
	for k, v := range info.MetaJSON {
		fields[k] = jsonToValue(v)
	}
	return &corev3.Node{
		Id: fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local",
			ip, info.PodName, info.PodNamespace, info.PodNamespace),
		Metadata: &structpb.Struct{Fields: fields},
	}
}

// jsonToValue converts a value decoded by encoding/json to a protobuf Value.
// Anything else is sent as its fmt.Sprint string rather than dropped.
func jsonToValue(v any) *structpb.Value {
	switch t := v.(type) {
	case nil:
		return structpb.NewNullValue()
	case bool:
		return structpb.NewBoolValue(t)
	case string:
		return structpb.NewStringValue(t)
	case float64:
		return structpb.NewNumberValue(t)
	case json.Number:
		f, err := t.Float64()
		if err != nil {
			return structpb.NewStringValue(t.String())
		}
		return structpb.NewNumberValue(f)
	case []any:
		vals := make([]*structpb.Value, len(t))
		for i, e := range t {
			vals[i] = jsonToValue(e)
		}
		return structpb.NewListValue(&structpb.ListValue{Values: vals})
	case map[string]any:
		fields := make(map[string]*structpb.Value, len(t))
		for k, e := range t {
			fields[k] = jsonToValue(e)
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields})
	}
	return structpb.NewStringValue(fmt.Sprint(v))
}
