package main

// Where the peer's prepare time goes, the Go side of dra_path's breakdown (the agent's side comes
// from its own histograms): the handler as the gRPC server runs it (a unary interceptor), the
// claim's GET inside it (a wrapper of client-go's transport, up to the body's close, so decoding
// the answer's bytes counts as the agent's read does), and the plugin's own work (the CDI spec
// write). What is left of the handler is the helper's: its metadata files and CDI spec, its lock
// and its answer. Sums since the start; the benchmark reads them before and after its rounds by
// writing "timings" on the peer's stdin, and it answers one JSON line on stdout.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

type phase struct {
	Seconds float64 `json:"seconds"`
	Count   int     `json:"count"`
}

type timings struct {
	mu      sync.Mutex
	Handler phase `json:"handler"`
	Get     phase `json:"claim_get"`
	Driver  phase `json:"driver"`
}

var spent timings

func (t *timings) add(p *phase, since time.Time) {
	d := time.Since(since).Seconds()
	t.mu.Lock()
	p.Seconds += d
	p.Count++
	t.mu.Unlock()
}

func (t *timings) print(out io.Writer) {
	t.mu.Lock()
	doc, err := json.Marshal(t)
	t.mu.Unlock()
	if err != nil {
		doc = []byte(fmt.Sprintf(`{"error": %q}`, err.Error()))
	}
	fmt.Fprintln(out, string(doc))
}

// timePrepare is the gRPC server's unary interceptor: NodePrepareResources' handler, timed.
func timePrepare(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	resp, err := handler(ctx, req)
	if strings.HasSuffix(info.FullMethod, "/NodePrepareResources") {
		spent.add(&spent.Handler, t0)
	}
	return resp, err
}

// timedGets times each GET of a ResourceClaim, from the request to the close of its body.
type timedGets struct{ next http.RoundTripper }

func (t timedGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/resourceclaims/") {
		return t.next.RoundTrip(req)
	}
	t0 := time.Now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		spent.add(&spent.Get, t0)
		return resp, err
	}
	resp.Body = &timedBody{ReadCloser: resp.Body, since: t0}
	return resp, nil
}

type timedBody struct {
	io.ReadCloser
	since time.Time
	once  sync.Once
}

func (b *timedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { spent.add(&spent.Get, b.since) })
	return err
}
