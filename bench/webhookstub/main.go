// A do-nothing-else pod-gating admission webhook, for measurement only: it answers every
// AdmissionReview by adding the scheduling gate to a pod that has none. It lets the benchmark
// compare what kube-apiserver measures for our webhook with what it measures for the cheapest
// possible native one on the same machine, under the same burst.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
)

type review struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Request    json.RawMessage `json:"request,omitempty"`
	Response   *response       `json:"response,omitempty"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     []byte `json:"patch,omitempty"`
}

type request struct {
	UID    string `json:"uid"`
	Object struct {
		Spec struct {
			SchedulingGates []json.RawMessage `json:"schedulingGates"`
		} `json:"spec"`
	} `json:"object"`
}

func main() {
	port := flag.String("addr", "127.0.0.1:9443", "listen address")
	cert := flag.String("cert", "tls.crt", "serving certificate")
	key := flag.String("key", "tls.key", "serving key")
	gate := flag.String("gate", "instaslice.dev/placement", "scheduling gate to add")
	flag.Parse()
	patch, _ := json.Marshal([]map[string]any{{
		"op": "add", "path": "/spec/schedulingGates",
		"value": []map[string]string{{"name": *gate}},
	}})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var in review
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req request
		if err := json.Unmarshal(in.Request, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := review{APIVersion: in.APIVersion, Kind: in.Kind, Response: &response{UID: req.UID, Allowed: true}}
		if len(req.Object.Spec.SchedulingGates) == 0 {
			out.Response.PatchType = "JSONPatch"
			out.Response.Patch = patch
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	log.Fatal(http.ListenAndServeTLS(*port, *cert, *key, nil))
}
