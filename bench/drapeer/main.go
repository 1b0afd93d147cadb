// Command drapeer is the Go baseline for bench/dra_path.py: a DRA kubelet plugin built from the
// upstream helper library k8s.io/dynamic-resource-allocation/kubeletplugin at the pinned release,
// doing the same prepare work as Patchbay's agent: the helper reads each claim from the API server
// (and checks its UID), then the plugin writes one CDI spec per claim (one CDI device per
// allocated device of its driver and pool, whose edit is the device node) and answers the CDI
// device IDs; unprepare deletes the claim's spec. As the agent does, it also has the helper write
// each request's device metadata file (KEP-5304: metadata.resource.k8s.io v1beta1 then v1alpha1,
// the device's id, path and health as attributes) and the CDI spec that mounts it, in the same CDI
// directory (--metadata=false leaves that out).
//
//	drapeer --kubeconfig FILE --driver NAME --node NODE --dir DIR --cdi-dir DIR --dev-dir DIR [--metadata=false]
//	drapeer call --socket PATH < claims
//
// The second form is the benchmark's client, shaped like the kubelet's (call.go): it times the
// calls on either side's socket.
//
// The registration socket goes to DIR/registry, a directory the kubelet does not watch, so the
// peer never registers with the node's kubelet: the benchmark calls its DRA socket directly, as
// it calls the agent's. It prints the DRA socket's path on stdout once serving and runs until
// stdin closes; a line "timings" on stdin has it print where its prepare time went (timings.go).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// attributeDomain is the agent's: its ResourceSlices and metadata files name each device's
// attributes under it.
const attributeDomain = "patchbay.dev"

type peer struct {
	driver, pool, cdiDir, devDir string
}

func (p *peer) specPath(uid types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("drapeer_%s_%s.json", p.driver, uid))
}

func (p *peer) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s is not allocated", claim.Name)}
	}
	type node struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath"`
	}
	type edits struct {
		DeviceNodes []node `json:"deviceNodes"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	var devices []device
	var result kubeletplugin.PrepareResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != p.driver || r.Pool != p.pool {
			continue
		}
		path := filepath.Join(p.devDir, r.Device)
		name := fmt.Sprintf("%s-%s", claim.UID, r.Device)
		devices = append(devices, device{Name: name, ContainerEdits: edits{DeviceNodes: []node{{Path: path, HostPath: path}}}})
		id, healthy := r.Device, true
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s/device=%s", p.driver, name)},
			// Written by the helper only when EnableDeviceMetadata is on (--metadata).
			Metadata: &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{
				attributeDomain + "/id":      {StringValue: &id},
				attributeDomain + "/path":    {StringValue: &path},
				attributeDomain + "/healthy": {BoolValue: &healthy},
			}},
		})
	}
	doc, err := json.Marshal(map[string]any{"cdiVersion": "0.5.0", "kind": p.driver + "/device", "devices": devices})
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	tmp, err := os.CreateTemp(p.cdiDir, ".drapeer-*.tmp")
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	_, werr := tmp.Write(doc)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		_ = os.Remove(tmp.Name())
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("writing the CDI spec: %v %v", werr, cerr)}
	}
	if err := os.Rename(tmp.Name(), p.specPath(claim.UID)); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return result
}

func (p *peer) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	defer spent.add(&spent.Driver, time.Now())
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = p.prepare(c)
	}
	return out, nil
}

func (p *peer) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(p.specPath(c.UID))
		if os.IsNotExist(err) {
			err = nil
		}
		out[c.UID] = err
	}
	return out, nil
}

// WatchHealthStatus is never called: the health service is off (HealthService(false)).
func (p *peer) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func (p *peer) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "drapeer: %s: %v\n", msg, err)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "call" {
		callMain(os.Args[2:])
		return
	}
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	driver := flag.String("driver", "", "DRA driver name")
	node := flag.String("node", "", "node name (the pool)")
	dir := flag.String("dir", "", "directory for the peer's sockets")
	cdiDir := flag.String("cdi-dir", "", "where the CDI specs go")
	devDir := flag.String("dev-dir", "", "directory of the device nodes (device name = file name)")
	metadata := flag.Bool("metadata", true, "have the helper write each request's device metadata file and its CDI spec, as the agent does")
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// client-go's default client-side rate limit (5 requests/s, burst 10) would make every
	// prepare after the tenth wait about 200 ms for its GET: the benchmark compares the work, not
	// that default, so the limit is lifted (the agent has none).
	cfg.QPS, cfg.Burst = 1000, 1000
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return timedGets{rt} })
	client := kubernetes.NewForConfigOrDie(cfg)
	for _, d := range []string{filepath.Join(*dir, "registry"), filepath.Join(*dir, "plugin"), *cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, &peer{driver: *driver, pool: *node, cdiDir: *cdiDir, devDir: *devDir},
		kubeletplugin.DriverName(*driver),
		kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(*dir, "registry")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(*dir, "plugin")),
		kubeletplugin.HealthService(false),
		// The same versions, newest first, as the agent writes.
		kubeletplugin.EnableDeviceMetadata(*metadata, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}),
		kubeletplugin.CDIDirectory(*cdiDir),
		kubeletplugin.GRPCInterceptor(timePrepare),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer helper.Stop()
	matches, _ := filepath.Glob(filepath.Join(*dir, "plugin", "*.sock"))
	if len(matches) != 1 {
		fmt.Fprintf(os.Stderr, "drapeer: expected one socket in %s, found %v\n", filepath.Join(*dir, "plugin"), matches)
		os.Exit(1)
	}
	fmt.Println(matches[0])
	s := bufio.NewScanner(os.Stdin)
	for s.Scan() {
		if s.Text() == "timings" {
			spent.print(os.Stdout)
		}
	}
}
