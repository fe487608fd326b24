// A JSON-RPC client as Go programs usually are: net/http's default transport, which asks for
// gzip and decodes it. POSTs stdin to the URL and writes the decoded body to stdout; stderr gets
// whether the transport decoded it.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	response, err := http.Post(os.Args[1], "application/json", os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "status=%d decoded=%v cache=%s\n", response.StatusCode, response.Uncompressed,
		response.Header.Get("X-Rpcedge-Cache"))
	os.Stdout.Write(body)
}
