#!/usr/bin/env bash
# Installs the system tools keylane's tests and local broker need, with apt-get, when missing:
# kcat (a real third-party Kafka client for end-to-end tests), Maven and a Java 17 runtime
# (they fetch and run the Apache Kafka broker from Maven Central jars), Prometheus (its promtool
# checks and unit-tests deploy/prometheus/, tests/deploy/; its server is the one `make run` starts
# and the observability test scrapes with) and docker-compose (it renders and validates
# docker-compose.yml without a Docker engine).
set -euo pipefail

need=()
command -v kcat >/dev/null || need+=(kcat)
command -v mvn >/dev/null || need+=(maven)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
command -v docker-compose >/dev/null || need+=(docker-compose)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "keylane: missing ${need[*]}: run 'sudo apt-get install -y ${need[*]}' and retry" >&2
  exit 1
fi

echo "installing ${need[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

# Debian's prometheus package starts its own Prometheus on :9090 where systemd runs; keylane
# runs its own (`make run`, the tests), and `make run` and docker-compose.yml's want the port.
if [[ " ${need[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null \
  && systemctl is-active --quiet prometheus 2>/dev/null; then
  "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
