# scripts/lib/service.sh: the service as the scripts that drive it over HTTP start it
# (fuzz.sh, clients.sh, console.sh). Sourced, not run: the sourcing script defines `die`
# and `log`, and sets BIN (the binary) and TOKEN (the admin token).
#
#   start_service DIR [NAME=VALUE ...]
#       The service on a free loopback port (port 0: it prints the one it took), with its
#       SQLite database and its log (service.log) in DIR and its counters embedded: the
#       stores' and exporters' variables the environment may carry are unset, and the
#       NAME=VALUE settings given are added. Waits until GET /readyz answers 200 (30 s at
#       most); sets URL and SERVICE_PID.
#   stop_service
#       SIGTERM, then SIGKILL after 5 s; a no-op when no service runs.

SERVICE_PID=""
URL=""

stop_service() {
	if [[ -n $SERVICE_PID ]] && kill -0 "$SERVICE_PID" 2>/dev/null; then
		kill -TERM "$SERVICE_PID" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$SERVICE_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$SERVICE_PID" 2>/dev/null || true
		wait "$SERVICE_PID" 2>/dev/null || true
	fi
	SERVICE_PID=""
}

start_service() {
	local dir=$1 port="" code=""
	shift
	mkdir -p "$dir"
	env -u REDIS_URL -u REDIS_CLUSTER -u QUOTA_REDIS_PREFIX -u QUOTA_ON_STORE_ERROR \
		-u QUOTA_CLIENT_TOKENS -u QUOTA_GRPC_LISTEN -u QUOTA_LEDGER_BACKLOG_MAX \
		-u OTEL_EXPORTER_OTLP_ENDPOINT \
		QUOTA_LISTEN=127.0.0.1:0 \
		DATABASE_URL="sqlite://$dir/db.sqlite" \
		QUOTA_ADMIN_TOKEN="$TOKEN" \
		RUST_LOG=warn \
		"$@" \
		"$BIN" serve >"$dir/service.log" 2>&1 &
	SERVICE_PID=$!
	for _ in $(seq 300); do
		port=$(sed -n 's/^quota-ledger listening on port \([0-9]*\).*/\1/p' "$dir/service.log")
		[[ -n $port ]] && break
		kill -0 "$SERVICE_PID" 2>/dev/null || die "the service exited at start (see its log below)"
		sleep 0.1
	done
	[[ -n $port ]] || die "the service did not report its port within 30 s"
	URL="http://127.0.0.1:$port"
	for _ in $(seq 300); do
		code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz" || true)
		[[ $code == 200 ]] && break
		kill -0 "$SERVICE_PID" 2>/dev/null || die "the service exited before it was ready"
		sleep 0.1
	done
	[[ $code == 200 ]] || die "GET /readyz answered $code, not 200, for 30 s"
	log "service at $URL (pid $SERVICE_PID, data in $dir)"
}
