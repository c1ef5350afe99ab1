// Command loadgen posts one AdmissionReview body to an HTTPS URL, either closed-loop at a fixed concurrency
// (throughput) or open-loop at a fixed rate (latency), and prints one JSON line of results.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

type result struct {
	URL         string  `json:"url"`
	Mode        string  `json:"mode"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	Seconds     float64 `json:"seconds"`
	RPS         float64 `json:"rps"`
	P50Millis   float64 `json:"p50_ms"`
	P99Millis   float64 `json:"p99_ms"`
	TargetRate  int     `json:"target_rate,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
}

func main() {
	url := flag.String("url", "", "target URL")
	bodyFile := flag.String("body", "", "file with the request body")
	caFile := flag.String("ca", "", "CA bundle to trust")
	concurrency := flag.Int("concurrency", 16, "closed loop: requests in flight")
	rate := flag.Int("rate", 0, "open loop: requests per second (0 = closed loop)")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	flag.Parse()

	body, err := os.ReadFile(*bodyFile)
	check(err)
	pem, err := os.ReadFile(*caFile)
	check(err)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var mu sync.Mutex
	var latencies []time.Duration
	errors := 0
	send := func() {
		start := time.Now()
		resp, err := client.Post(*url, "application/json", bytes.NewReader(body))
		ok := err == nil && resp.StatusCode == 200
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		elapsed := time.Since(start)
		mu.Lock()
		if ok {
			latencies = append(latencies, elapsed)
		} else {
			errors++
		}
		mu.Unlock()
	}

	// warm the connections so TLS handshakes are not measured
	for i := 0; i < 20; i++ {
		send()
	}
	latencies, errors = nil, 0

	began := time.Now()
	deadline := began.Add(*duration)
	var wg sync.WaitGroup
	mode := "closed"
	if *rate > 0 {
		mode = "open"
		interval := time.Second / time.Duration(*rate)
		for next := began; next.Before(deadline); next = next.Add(interval) {
			time.Sleep(time.Until(next))
			wg.Add(1)
			go func() { defer wg.Done(); send() }()
		}
	} else {
		for i := 0; i < *concurrency; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					send()
				}
			}()
		}
	}
	wg.Wait()
	seconds := time.Since(began).Seconds()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	pct := func(p float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	out := result{URL: *url, Mode: mode, Requests: len(latencies), Errors: errors, Seconds: seconds,
		RPS: float64(len(latencies)) / seconds, P50Millis: pct(0.50), P99Millis: pct(0.99)}
	if *rate > 0 {
		out.TargetRate = *rate
	} else {
		out.Concurrency = *concurrency
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
