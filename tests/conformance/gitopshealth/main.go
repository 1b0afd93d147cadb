// gitopshealth: what Argo CD and Flux say about an object, computed with their own code.
//
// Argo CD's side runs a resource customization's health.lua in gopher-lua (the Lua 5.1 VM that
// Argo CD embeds) under Argo CD's entry conventions: the object as the global `obj`, the script's
// return value a table whose `status` (Healthy, Progressing, Degraded, Suspended, Missing or
// Unknown; anything else reads Unknown) and `message` Argo CD shows. Each object is evaluated
// twice: with only the libraries Argo CD opens for a script from `argocd-cm` (package, base,
// table; its restricted os library is left out: a check that needs it fails here), and with
// every standard library, as Argo CD runs the built-in scripts of its resource_customizations/
// folder. A check offered upstream must give the same answer both ways.
//
// Flux's side is kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute), the library behind
// Flux's health checks, `flux ... --wait` and `kubectl wait`-style tools.
//
// Usage: gitopshealth HEALTH_LUA < objects.jsonl > results.jsonl
// (one JSON object a line in, one result a line out: {"argocd": {...}, "argocdOpenLibs": {...},
// "kstatus": {"status": ..., "message": ...}}, or {"error": ...} for that object).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// Health is what Argo CD keeps of a health check's answer.
type Health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type result struct {
	ArgoCD         *Health `json:"argocd,omitempty"`
	ArgoCDOpenLibs *Health `json:"argocdOpenLibs,omitempty"`
	Kstatus        *Health `json:"kstatus,omitempty"`
	Error          string  `json:"error,omitempty"`
}

// The health codes Argo CD accepts from a script (gitops-engine's HealthStatusCode values).
var validHealth = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true,
}

// toLua turns a decoded object into the Lua value a script sees: objects and arrays become tables
// (arrays 1-based), numbers (int64 or float64, as Kubernetes' JSON decoder gives them) Lua
// numbers, null nil.
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case []any:
		t := L.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(toLua(L, item))
		}
		return t
	case map[string]any:
		t := L.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetString(k, toLua(L, item))
		}
		return t
	}
	return lua.LNil
}

// runHealth evaluates the script on one object; openLibs as for Argo CD's built-in scripts.
func runHealth(script string, obj map[string]any, openLibs bool) (*Health, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: !openLibs})
	defer L.Close()
	if !openLibs {
		for _, lib := range []struct {
			name string
			open lua.LGFunction
		}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
			if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
				return nil, err
			}
		}
	}
	// Argo CD gives a health script one second.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		return nil, err
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("expect table output from Lua script, not %s", L.Get(-1).Type())
	}
	h := &Health{Status: lua.LVAsString(ret.RawGetString("status")), Message: lua.LVAsString(ret.RawGetString("message"))}
	if !validHealth[h.Status] {
		return &Health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return h, nil
}

func evaluate(script string, line []byte) result {
	// Decoded as an unstructured object is (whole numbers as int64): what Argo CD's and kstatus's
	// callers hold.
	var obj map[string]any
	if err := utiljson.Unmarshal(line, &obj); err != nil {
		return result{Error: "not a JSON object: " + err.Error()}
	}
	var r result
	var err error
	if r.ArgoCD, err = runHealth(script, obj, false); err != nil {
		return result{Error: "health.lua (argocd-cm libraries): " + err.Error()}
	}
	if r.ArgoCDOpenLibs, err = runHealth(script, obj, true); err != nil {
		return result{Error: "health.lua (all libraries): " + err.Error()}
	}
	// kstatus reads its own copy: Compute does not change the object, but the Lua side must
	// never see a value kstatus decoded differently.
	var copied map[string]any
	if err := utiljson.Unmarshal(line, &copied); err != nil {
		return result{Error: err.Error()}
	}
	ks, err := status.Compute(&unstructured.Unstructured{Object: copied})
	if err != nil {
		return result{Error: "kstatus: " + err.Error()}
	}
	r.Kstatus = &Health{Status: ks.Status.String(), Message: ks.Message}
	return r
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gitopshealth HEALTH_LUA < objects.jsonl")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		if len(in.Bytes()) == 0 {
			continue
		}
		if err := out.Encode(evaluate(string(script), in.Bytes())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
