#!/usr/bin/env bash
# Prints the path of buf (protobuf lint, breaking-change check and code
# generation), built once from the Go module proxy (about two minutes
# cold) and cached by version.
exec "$(dirname "$0")/go-install-cached.sh" buf github.com/bufbuild/buf/cmd/buf v1.75.0
