// Command peer is Patchbay's conformance peer: the upstream kubelet's OWN device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager at the pinned release) driven without the rest
// of the kubelet, so the Python agent is tested against the code that will really talk to it.
//
// Two modes:
//
//	peer kubelet --dir DIR [--numa N]
//	    Runs devicemanager.ManagerImpl with its real registration server on DIR/kubelet.sock
//	    (the real plugin client, the real ListAndWatch handling, the real allocation logic and
//	    checkpoint). The test drives it with one JSON object per line on stdin and reads one
//	    JSON reply per line on stdout (see `handle` for the ops). klog goes to stderr.
//
//	peer stub --dir DIR --resource NAME --devices N
//	    Serves the upstream Go stub device plugin (plugin/v1beta1.Stub) and registers it with
//	    DIR/kubelet.sock: the baseline the benchmarks compare the Python agent with. Runs until
//	    stdin closes.
//
// The only additions to upstream code are compiled into the devicemanager package through
// `go build -overlay` (see devicemanager_export.go.in): an exported constructor (the package's
// exported one hard-codes /var/lib/kubelet/device-plugins/kubelet.sock, the unexported one, which
// the package's own unit tests use, takes the socket path) and a read-only view of the manager's
// endpoints per resource.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager/bitmask"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

var start = time.Now()

func sinceStart() int64 { return int64(time.Since(start)) }

// ---------------------------------------------------------------------------------------------
// The pieces of the kubelet around the device manager that the peer stands in for: the pod
// sources (always ready), the active pods (the ones the test admitted) and the topology manager's
// hint store (the NUMA affinity the test asks for, or none).

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

type hintStore struct {
	mu    sync.Mutex
	hints map[string]topologymanager.TopologyHint // podUID/container
}

func (s *hintStore) GetAffinity(_ klog.Logger, podUID, container string) topologymanager.TopologyHint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hints[podUID+"/"+container]
}

func (s *hintStore) GetPolicy() topologymanager.Policy { return topologymanager.NewNonePolicy() }

func (s *hintStore) Name() string { return "patchbay-conformance-peer" }

type kubelet struct {
	dir      string
	numa     int
	logger   klog.Logger
	mgr      *devicemanager.ManagerImpl
	hints    *hintStore
	podsMu   sync.Mutex
	pods     map[string]*v1.Pod
	startedN int64
	sampler  *sampler
}

// sampler reads one resource's capacity, allocatable and endpoints from ONE manager in the
// background, as fast as the interval allows, and keeps the extremes and every change (not every
// sample, so a long run stays small). Started by sample_start, ended by sample_stop; the manager
// is the one running at sample_start (do not restart the kubelet while sampling).
type sampler struct {
	resource string
	mgr      *devicemanager.ManagerImpl
	logger   klog.Logger
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}

	samples                    int64
	minCap, maxCap             int64
	minAlloc, maxAlloc         int64
	maxEndpoints, minEndpoints int
	changes                    []map[string]any
}

// value returns the quantity for the resource, or -1 when the manager does not report it.
func value(l map[string]int64, resource string) int64 {
	if v, ok := l[resource]; ok {
		return v
	}
	return -1
}

func (s *sampler) run() {
	defer close(s.done)
	var last map[string]any
	for {
		c, a, _ := s.mgr.GetCapacity(s.logger)
		sockets, primary := s.mgr.EndpointsForConformancePeer(s.resource)
		cv, av := value(quantities(c), s.resource), value(quantities(a), s.resource)
		if s.samples == 0 {
			s.minCap, s.maxCap, s.minAlloc, s.maxAlloc = cv, cv, av, av
			s.minEndpoints, s.maxEndpoints = len(sockets), len(sockets)
		}
		s.samples++
		s.minCap, s.maxCap = min(s.minCap, cv), max(s.maxCap, cv)
		s.minAlloc, s.maxAlloc = min(s.minAlloc, av), max(s.maxAlloc, av)
		s.minEndpoints, s.maxEndpoints = min(s.minEndpoints, len(sockets)), max(s.maxEndpoints, len(sockets))
		cur := map[string]any{"capacity": cv, "allocatable": av, "endpoints": sockets, "primary": primary}
		if last == nil || last["capacity"] != cv || last["allocatable"] != av || last["primary"] != primary ||
			strings.Join(last["endpoints"].([]string), ",") != strings.Join(sockets, ",") {
			change := map[string]any{"t_ns": sinceStart(), "sample": s.samples}
			for k, v := range cur {
				change[k] = v
			}
			s.changes = append(s.changes, change)
			last = cur
		}
		select {
		case <-s.stop:
			return
		case <-time.After(s.interval):
		}
	}
}

func (s *sampler) result() reply {
	return reply{
		"resource": s.resource, "samples": s.samples,
		"min_capacity": s.minCap, "max_capacity": s.maxCap,
		"min_allocatable": s.minAlloc, "max_allocatable": s.maxAlloc,
		"min_endpoints": s.minEndpoints, "max_endpoints": s.maxEndpoints,
		"changes": s.changes, "t_ns": sinceStart(),
	}
}

func (k *kubelet) activePods() []*v1.Pod {
	k.podsMu.Lock()
	defer k.podsMu.Unlock()
	out := make([]*v1.Pod, 0, len(k.pods))
	for _, p := range k.pods {
		out = append(out, p)
	}
	return out
}

// startManager is what a kubelet start does for devices: a NEW manager (no memory of the old
// one, except what its checkpoint file holds), whose registration server first deletes every
// socket in the directory and then listens on kubelet.sock.
func (k *kubelet) startManager() error {
	var topo []cadvisorapi.Node
	for i := 0; i < k.numa; i++ {
		topo = append(topo, cadvisorapi.Node{Id: i})
	}
	m, err := devicemanager.NewManagerImplForConformancePeer(k.logger, filepath.Join(k.dir, "kubelet.sock"), topo, k.hints)
	if err != nil {
		return err
	}
	if err := m.Start(k.logger, k.activePods, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	k.mgr = m
	k.startedN = sinceStart()
	return nil
}

func (k *kubelet) stopManager() error {
	if k.mgr == nil {
		return nil
	}
	err := k.mgr.Stop(k.logger)
	k.mgr = nil
	return err
}

type request struct {
	ID          int64    `json:"id"`
	Op          string   `json:"op"`
	Resource    string   `json:"resource"`
	Pod         string   `json:"pod"`
	Container   string   `json:"container"`
	Count       int64    `json:"count"`
	NUMA        []int    `json:"numa"`
	Capacity    *int64   `json:"capacity"`
	Allocatable *int64   `json:"allocatable"`
	TimeoutMS   int64    `json:"timeout_ms"`
	Socket      string   `json:"socket"`
	N           int      `json:"n"`
	Devices     []string `json:"devices"`
	Checkpoint  bool     `json:"wipe_checkpoint"`
	IntervalUS  int64    `json:"interval_us"`
}

type reply map[string]any

func quantities(l v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for k, v := range l {
		out[string(k)] = v.Value()
	}
	return out
}

func (k *kubelet) capacity() (map[string]int64, map[string]int64, []string) {
	if k.mgr == nil {
		return map[string]int64{}, map[string]int64{}, nil
	}
	c, a, d := k.mgr.GetCapacity(k.logger)
	sort.Strings(d)
	return quantities(c), quantities(a), d
}

func (k *kubelet) handle(ctx context.Context, r request) (reply, error) {
	switch r.Op {
	case "ping":
		return reply{"t_ns": sinceStart()}, nil

	case "capacity":
		c, a, d := k.capacity()
		return reply{"capacity": c, "allocatable": a, "deleted": d, "t_ns": sinceStart()}, nil

	case "wait":
		// Poll the manager the way the kubelet's node status loop reads it, but every 200us, until
		// the resource shows the wanted numbers. `elapsed_ns` is measured here, in the peer.
		deadline := time.Now().Add(time.Duration(r.TimeoutMS) * time.Millisecond)
		begin := time.Now()
		for {
			c, a, _ := k.capacity()
			cv, cok := c[r.Resource]
			av, aok := a[r.Resource]
			match := (r.Capacity == nil || (cok && cv == *r.Capacity)) && (r.Allocatable == nil || (aok && av == *r.Allocatable))
			if match {
				return reply{"capacity": c, "allocatable": a, "elapsed_ns": int64(time.Since(begin)), "t_ns": sinceStart()}, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("timeout after %dms: capacity=%v allocatable=%v", r.TimeoutMS, c, a)
			}
			time.Sleep(200 * time.Microsecond)
		}

	case "endpoints":
		// The plugin endpoints the manager holds for a resource (one per registered socket path)
		// and the primary one (where Allocate goes).
		if k.mgr == nil {
			return reply{"endpoints": []string{}, "primary": ""}, nil
		}
		sockets, primary := k.mgr.EndpointsForConformancePeer(r.Resource)
		return reply{"endpoints": sockets, "primary": primary}, nil

	case "sample_start":
		// Sample GetCapacity and the endpoints of one resource in the background every
		// interval_us (default 200us) until sample_stop; the other ops keep working meanwhile.
		if k.mgr == nil {
			return nil, fmt.Errorf("kubelet stopped")
		}
		if k.sampler != nil {
			return nil, fmt.Errorf("already sampling %s", k.sampler.resource)
		}
		interval := time.Duration(r.IntervalUS) * time.Microsecond
		if interval <= 0 {
			interval = 200 * time.Microsecond
		}
		k.sampler = &sampler{resource: r.Resource, mgr: k.mgr, logger: k.logger, interval: interval,
			stop: make(chan struct{}), done: make(chan struct{})}
		go k.sampler.run()
		return reply{"t_ns": sinceStart()}, nil

	case "sample_stop":
		// Stop sampling; the samples' extremes and every change seen, with the time it was seen.
		if k.sampler == nil {
			return nil, fmt.Errorf("not sampling")
		}
		s := k.sampler
		k.sampler = nil
		close(s.stop)
		<-s.done
		return s.result(), nil

	case "devices":
		if k.mgr == nil {
			return reply{"healthy": map[string][]string{}}, nil
		}
		out := map[string][]map[string]any{}
		for res, devs := range k.mgr.GetAllocatableDevices(k.logger) {
			for id, d := range devs {
				var nodes []int64
				if d.Topology != nil {
					for _, n := range d.Topology.Nodes {
						nodes = append(nodes, n.ID)
					}
				}
				out[res] = append(out[res], map[string]any{"id": id, "health": d.Health, "numa": nodes})
			}
			sort.Slice(out[res], func(i, j int) bool { return out[res][i]["id"].(string) < out[res][j]["id"].(string) })
		}
		return reply{"healthy": out}, nil

	case "allocate":
		return k.allocate(ctx, r)

	case "remove_pod":
		k.podsMu.Lock()
		delete(k.pods, r.Pod)
		k.podsMu.Unlock()
		if k.mgr != nil {
			k.mgr.UpdateAllocatedDevices(k.logger)
		}
		return reply{}, nil

	case "stop":
		return reply{}, k.stopManager()

	case "start":
		if k.mgr != nil {
			return nil, fmt.Errorf("already running")
		}
		if err := k.startManager(); err != nil {
			return nil, err
		}
		return reply{"t_ns": k.startedN}, nil

	case "restart":
		// A kubelet restart: the old registration server and plugin clients go away, a new
		// manager starts (deleting every socket in the directory, then creating kubelet.sock).
		if err := k.stopManager(); err != nil {
			return nil, err
		}
		if r.Checkpoint {
			_ = os.Remove(filepath.Join(k.dir, "kubelet_internal_checkpoint"))
		}
		if err := k.startManager(); err != nil {
			return nil, err
		}
		return reply{"t_ns": k.startedN}, nil

	case "bench_allocate":
		return benchAllocate(ctx, r)
	}
	return nil, fmt.Errorf("unknown op %q", r.Op)
}

func (k *kubelet) allocate(ctx context.Context, r request) (reply, error) {
	if k.mgr == nil {
		return nil, fmt.Errorf("kubelet stopped")
	}
	k.podsMu.Lock()
	pod, ok := k.pods[r.Pod]
	if !ok {
		pod = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-" + r.Pod, Namespace: "default", UID: types.UID(r.Pod)}}
		k.pods[r.Pod] = pod
	}
	qty := *resource.NewQuantity(r.Count, resource.DecimalSI)
	container := v1.Container{
		Name: r.Container,
		Resources: v1.ResourceRequirements{
			Limits:   v1.ResourceList{v1.ResourceName(r.Resource): qty},
			Requests: v1.ResourceList{v1.ResourceName(r.Resource): qty},
		},
	}
	pod.Spec.Containers = append(pod.Spec.Containers, container)
	k.podsMu.Unlock()
	if len(r.NUMA) > 0 {
		mask, err := bitmask.NewBitMask(r.NUMA...)
		if err != nil {
			return nil, err
		}
		k.hints.mu.Lock()
		k.hints.hints[r.Pod+"/"+r.Container] = topologymanager.TopologyHint{NUMANodeAffinity: mask, Preferred: true}
		k.hints.mu.Unlock()
	}
	// The kubelet's admission path: Allocate, then (when the container is created) the run
	// options, which is where PreStartContainer is called if the plugin asked for it.
	if err := k.mgr.Allocate(ctx, pod, &container, lifecycle.AddOperation); err != nil {
		return nil, err
	}
	opts, err := k.mgr.GetDeviceRunContainerOptions(ctx, pod, &container)
	if err != nil {
		return nil, err
	}
	var ids []string
	for id := range k.mgr.GetDevices(r.Pod, r.Container)[r.Resource] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	envs := map[string]string{}
	var mounts, devices []map[string]any
	annotations := map[string]string{}
	var cdi []string
	if opts != nil {
		for _, e := range opts.Envs {
			envs[e.Name] = e.Value
		}
		for _, m := range opts.Mounts {
			mounts = append(mounts, map[string]any{"container_path": m.ContainerPath, "host_path": m.HostPath, "read_only": m.ReadOnly})
		}
		for _, d := range opts.Devices {
			devices = append(devices, map[string]any{"container_path": d.PathInContainer, "host_path": d.PathOnHost, "permissions": d.Permissions})
		}
		for _, a := range opts.Annotations {
			annotations[a.Name] = a.Value
		}
		for _, c := range opts.CDIDevices {
			cdi = append(cdi, c.Name)
		}
	}
	return reply{"device_ids": ids, "envs": envs, "mounts": mounts, "devices": devices, "annotations": annotations, "cdi_devices": cdi}, nil
}

// benchAllocate calls Allocate on a plugin socket n times, one after the other, through the same
// generated v1beta1 client and the same dial options the kubelet's plugin client uses, and
// returns latency percentiles measured in Go (so the Python and Go plugins are timed alike).
func benchAllocate(ctx context.Context, r request) (reply, error) {
	conn, err := grpc.NewClient("passthrough:///"+r.Socket,
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: r.Devices}}}
	warm := r.N / 20
	if warm > 2000 {
		warm = 2000
	}
	for i := 0; i < warm; i++ {
		if _, err := client.Allocate(ctx, req); err != nil {
			return nil, fmt.Errorf("warm-up Allocate: %w", err)
		}
	}
	lat := make([]int64, r.N)
	errs := 0
	begin := time.Now()
	for i := 0; i < r.N; i++ {
		t0 := time.Now()
		_, err := client.Allocate(ctx, req)
		lat[i] = int64(time.Since(t0))
		if err != nil {
			errs++
		}
	}
	total := time.Since(begin)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) int64 {
		if len(lat) == 0 {
			return 0
		}
		idx := int(p * float64(len(lat)-1))
		return lat[idx]
	}
	return reply{
		"n": r.N, "errors": errs, "total_ns": int64(total),
		"p50_ns": pct(0.50), "p90_ns": pct(0.90), "p99_ns": pct(0.99), "p999_ns": pct(0.999), "max_ns": pct(1.0),
	}, nil
}

func runKubelet(args []string) error {
	fs := flag.NewFlagSet("kubelet", flag.ExitOnError)
	dir := fs.String("dir", "", "device-plugin directory (kubelet.sock is created here)")
	numa := fs.Int("numa", 2, "NUMA nodes the fake machine has")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	verbosity := fs.String("v", "2", "klog verbosity")
	_ = fs.Parse(args)
	_ = klogFlags.Set("v", *verbosity)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	k := &kubelet{
		dir:    *dir,
		numa:   *numa,
		logger: klog.Background(),
		hints:  &hintStore{hints: map[string]topologymanager.TopologyHint{}},
		pods:   map[string]*v1.Pod{},
	}
	if err := k.startManager(); err != nil {
		return err
	}
	ctx := context.Background()
	out := json.NewEncoder(os.Stdout)
	fmt.Fprintf(os.Stderr, "peer: kubelet device manager serving %s\n", filepath.Join(*dir, "kubelet.sock"))
	_ = out.Encode(reply{"ready": true, "t_ns": k.startedN})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var r request
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			_ = out.Encode(reply{"ok": false, "error": "bad request: " + err.Error()})
			continue
		}
		if r.Op == "quit" {
			break
		}
		res, err := k.handle(ctx, r)
		if err != nil {
			_ = out.Encode(reply{"id": r.ID, "ok": false, "error": err.Error()})
			continue
		}
		res["id"] = r.ID
		res["ok"] = true
		_ = out.Encode(res)
	}
	return k.stopManager()
}

func runStub(args []string) error {
	fs := flag.NewFlagSet("stub", flag.ExitOnError)
	dir := fs.String("dir", "", "device-plugin directory holding kubelet.sock")
	name := fs.String("resource", "", "extended resource name")
	n := fs.Int("devices", 8, "number of devices")
	_ = fs.Parse(args)
	// The stub logs every call at Info; the Python agent logs none on success. Silence klog so
	// the benchmark compares the gRPC paths, not stderr writes.
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("logtostderr", "false")
	_ = klogFlags.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	var devs []*pluginapi.Device
	for i := 0; i < *n; i++ {
		devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("dev-%d", i), Health: pluginapi.Healthy})
	}
	socket := filepath.Join(*dir, "go-stub.sock")
	logger := klog.Background()
	ctx := klog.NewContext(context.Background(), logger)
	stub := plugin.NewDevicePluginStub(logger, devs, socket, *name, false, false)
	// A response shaped like the agent's for one device: its file and the env listing it.
	stub.SetAllocFunc(func(r *pluginapi.AllocateRequest, _ map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
		resp := &pluginapi.AllocateResponse{}
		for _, cr := range r.ContainerRequests {
			c := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"PATCHBAY_DEVICES": strings.Join(cr.DevicesIds, ",")}}
			for _, id := range cr.DevicesIds {
				c.Devices = append(c.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: "/dev/" + id, Permissions: "rw"})
			}
			resp.ContainerResponses = append(resp.ContainerResponses, c)
		}
		return resp, nil
	})
	if err := stub.Start(ctx); err != nil {
		return err
	}
	if err := stub.Register(ctx, filepath.Join(*dir, "kubelet.sock"), *name, ""); err != nil {
		return err
	}
	fmt.Printf("{\"ready\": true, \"socket\": %q}\n", socket)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-done:
	case <-sig:
	}
	return stub.Stop(logger)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peer kubelet --dir DIR | peer stub --dir DIR --resource NAME")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "kubelet":
		err = runKubelet(os.Args[2:])
	case "stub":
		err = runStub(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
}
