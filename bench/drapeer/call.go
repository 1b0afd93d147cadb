package main

// The benchmark's client: `drapeer call --socket PATH` times NodePrepareResources and then
// NodeUnprepareResources on a DRA socket the way the kubelet calls them, so neither side's figure
// carries a Python client's cost. As the kubelet's DRA plugin manager
// (pkg/kubelet/cm/dra/plugin at the pinned release) does: one grpc-go connection made with
// grpc.NewClient("unix:"+socket) and insecure credentials, the DRA v1 service, each call under
// its own deadline (the kubelet's default, 45 s), one claim per call as the kubelet sends one
// pod's claims. The claims come on stdin, one "NAMESPACE NAME UID" line each; once stdin closes
// it prepares each in order, then unprepares each, and prints one JSON object:
// {"prepare": [seconds...], "unprepare": [seconds...]}. A call that fails, or a claim answered
// with an error or with no device, exits 1 naming the claim.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// callTimeout is the kubelet's default deadline for one call to a DRA plugin.
const callTimeout = 45 * time.Second

func callMain(args []string) {
	fs := flag.NewFlagSet("call", flag.ExitOnError)
	socket := fs.String("socket", "", "the DRA plugin's service socket")
	_ = fs.Parse(args)
	if *socket == "" {
		fail("call: --socket is required")
	}
	var claims []*drapbv1.Claim
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			fail("call: expected \"NAMESPACE NAME UID\" on stdin, got %q", in.Text())
		}
		claims = append(claims, &drapbv1.Claim{Namespace: f[0], Name: f[1], Uid: f[2]})
	}
	conn, err := grpc.NewClient("unix:"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("call: connect to %s: %v", *socket, err)
	}
	defer conn.Close()
	client := drapbv1.NewDRAPluginClient(conn)
	out := map[string][]float64{"prepare": {}, "unprepare": {}}
	for _, c := range claims {
		var resp *drapbv1.NodePrepareResourcesResponse
		took, err := timed(func(ctx context.Context) (err error) {
			resp, err = client.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{c}})
			return err
		})
		if got := resp.GetClaims()[c.Uid]; err == nil && (got == nil || got.Error != "" || len(got.Devices) != 1) {
			err = fmt.Errorf("answered %v", got)
		}
		if err != nil {
			fail("call: prepare of %s/%s on %s: %v", c.Namespace, c.Name, *socket, err)
		}
		out["prepare"] = append(out["prepare"], took)
	}
	for _, c := range claims {
		var resp *drapbv1.NodeUnprepareResourcesResponse
		took, err := timed(func(ctx context.Context) (err error) {
			resp, err = client.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{c}})
			return err
		})
		if got := resp.GetClaims()[c.Uid]; err == nil && (got == nil || got.Error != "") {
			err = fmt.Errorf("answered %v", got)
		}
		if err != nil {
			fail("call: unprepare of %s/%s on %s: %v", c.Namespace, c.Name, *socket, err)
		}
		out["unprepare"] = append(out["unprepare"], took)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("call: %v", err)
	}
}

// timed runs one call under the kubelet's deadline and answers its wall time in seconds; the
// answer's check is outside the timed span.
func timed(call func(ctx context.Context) error) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	t0 := time.Now()
	err := call(ctx)
	return time.Since(t0).Seconds(), err
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "drapeer: "+format+"\n", a...)
	os.Exit(1)
}
