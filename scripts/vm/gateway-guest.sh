#!/usr/bin/env bash
# Inside the VM, inside scripts/vm/garage-guest.sh's cluster: the gateway in
# front of the three Garage nodes over real verbs (rdma_rxe). Two gateways
# (`hipobj-s3-server --upstream`, Garage's node 0 and node 1) serve the
# hipobj command by RDMA:
#
#   1. PUT through one gateway, GET (whole and a range) through the other,
#      a multipart PUT, all with --no-fallback (RDMA or an error), checked
#      byte for byte, and the objects read back from Garage itself over
#      HTTP (what the gateways stored is in the cluster).
#   2. haproxy in front of both (HTTP, `balance uri`, `hash-type
#      consistent`: each object has one gateway), both with the cache on
#      (--cache-bytes): GETs of one object through haproxy are served by
#      one gateway, which read it from Garage once. GETs and PUTs of a
#      larger object go on through it while one gateway is killed
#      (SIGKILL): every command ends within its bound (none hangs) and
#      either succeeds byte for byte or fails with an error; what Garage
#      holds under a PUT's key is never a part: the whole object or
#      nothing. Then GETs through haproxy go on on the gateway that is
#      left, its keys moved to it.
#
#   3. With BENCH_MIB (a list of sizes), the benchmark: RDMA GETs through
#      gateway 2 (no cache) and hits of gateway 3 (the cache on, trusted)
#      against plain HTTP GETs (curl) straight from the Garage node behind
#      them and through gateway 2 itself, the same object for all, taken in
#      turn; throughput and time
#      to first byte (docs/performance.md, "The gateway in front of
#      Garage"), and each gateway's CPU per GiB it served.
#   4. With HIPOBJ_CACHE_MIB set (a size; not in CI), the cache's lane
#      figures: 8 clients reading one cold object at once through a cached
#      gateway (the store must serve it once, every client byte-exact);
#      cached GETs against a local-backend server's RDMA GETs of the same
#      object; Garage's node SIGSTOPped under a trusting and a validating
#      gateway; an application's GETs (its buffer registered once: `hipobj
#      bench`) by RDMA against the same gateway's plain HTTP, uncached and
#      cached.
#
#   gateway-guest.sh SERVER_BINARY HIPOBJ_BINARY [MIB [BENCH_MIB...]]
#
# MIB (default 16) is the size of the objects. Fails on the first check
# that does not hold; the benchmark prints figures and fails only if a
# transfer does.
set -euo pipefail
server_bin="$1"
hipobj="$2"
mib="${3:-16}"
bench=("${@:4}")
[[ -n "${HIPOBJ_GARAGE_ENDPOINT:-}" ]] || { echo "gateway-guest: run inside scripts/vm/garage-guest.sh" >&2; exit 1; }
work=$(mktemp -d)
pids=()
haproxy_pid=""
cleanup() {
    for pid in "${pids[@]}" $haproxy_pid; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "gateway-guest: FAILED: $*" >&2; exit 1; }

# The gateways' clients sign with these; Garage's own key (in AWS_*) is the
# gateways' for the upstream, and the checks' for reading Garage directly.
client_key=gateway-demo
client_secret=gateway-demo-secret
garage_key="$AWS_ACCESS_KEY_ID"
garage_secret="$AWS_SECRET_ACCESS_KEY"
bucket="$HIPOBJ_GARAGE_BUCKET"
read -r -a garage_endpoints <<<"$HIPOBJ_GARAGE_ENDPOINTS"

upstream_timeout_ms=60000
# Starts a gateway on rxe0 in front of Garage's endpoint $1, on port $2
# (its metrics on port $2 + 100), with more options after.
start_gateway() {
    local n=${#pids[@]}
    "$server_bin" --upstream "$1" --upstream-region "$HIPOBJ_GARAGE_REGION" \
        --listen "192.0.2.1:$2" --device rxe0 \
        --access-key "$client_key" --secret-key "$client_secret" \
        --upstream-timeout-ms "$upstream_timeout_ms" --metrics-listen "192.0.2.1:$(($2 + 100))" "${@:3}" \
        >"$work/gateway$n.out" 2>"$work/gateway$n.log" &
    pids+=($!)
    local deadline=$((SECONDS + 60))
    until grep -q "listening" "$work/gateway$n.out" 2>/dev/null || grep -q "http://" "$work/gateway$n.out" 2>/dev/null; do
        ((SECONDS < deadline)) || { cat "$work/gateway$n.log" >&2; fail "gateway $n did not start"; }
        kill -0 "${pids[$n]}" 2>/dev/null || { cat "$work/gateway$n.log" >&2; fail "gateway $n exited"; }
        sleep 0.2
    done
    echo "   gateway $n: $(head -1 "$work/gateway$n.out")"
}

# hipobj as a client of the gateway at $1, then its arguments (a script,
# so that background jobs run it too).
{
    echo '#!/usr/bin/env bash'
    echo 'endpoint="$1"; shift'
    echo "export AWS_ACCESS_KEY_ID=$client_key AWS_SECRET_ACCESS_KEY=$client_secret AWS_REGION=us-east-1"
    echo "AWS_ENDPOINT_URL=\"\$endpoint\" exec $(printf %q "$hipobj") \"\$@\" --no-progress"
} >"$work/via"
chmod +x "$work/via"
via() { "$work/via" "$@"; }

# hipobj as a client of Garage itself (plain HTTP: Garage has no RDMA).
direct() {
    AWS_ENDPOINT_URL="$HIPOBJ_GARAGE_ENDPOINT" AWS_ACCESS_KEY_ID="$garage_key" \
        AWS_SECRET_ACCESS_KEY="$garage_secret" AWS_REGION="$HIPOBJ_GARAGE_REGION" "$hipobj" "$@" --no-progress
}

a=http://192.0.2.1:9101
b=http://192.0.2.1:9102
# A metric's sum over its series (their labels containing $3) at the
# gateway whose metrics are on port $1.
metric() {
    curl -sS "http://192.0.2.1:$1/metrics" | awk -v name="$2" -v labels="${3:-}" '
        index($1, name) == 1 && (substr($1, length(name) + 1, 1) == "{" || length($1) == length(name)) && index($0, labels) { s += $NF }
        END { printf "%d\n", s }'
}
start_gateway "${garage_endpoints[0]}" 9101 --cache-bytes 268435456
start_gateway "${garage_endpoints[1]}" 9102 --cache-bytes 268435456

echo "== 1. by RDMA through the gateways, into Garage and back"
head -c $((mib << 20)) /dev/urandom >"$work/data"
echo "\$ hipobj put data s3://$bucket/gw/data --no-fallback   (gateway 0)"
via "$a" put "$work/data" "s3://$bucket/gw/data" --no-fallback
echo "\$ hipobj get s3://$bucket/gw/data back --no-fallback   (gateway 1)"
via "$b" get "s3://$bucket/gw/data" "$work/back" --no-fallback
cmp "$work/data" "$work/back" || fail "GET through gateway 1: bytes differ"
echo "   byte-exact"
echo "\$ hipobj get s3://$bucket/gw/data part --range 1000003-3000002 --no-fallback"
via "$b" get "s3://$bucket/gw/data" "$work/part" --range 1000003-3000002 --no-fallback
cmp "$work/part" <(tail -c +1000004 "$work/data" | head -c 2000000) || fail "ranged GET: bytes differ"
echo "   byte-exact"
echo "\$ hipobj put data s3://$bucket/gw/parts --chunk 5MiB --no-fallback   (multipart)"
via "$a" put "$work/data" "s3://$bucket/gw/parts" --chunk 5MiB --no-fallback
echo "\$ hipobj get s3://$bucket/gw/parts (from Garage itself, plain HTTP)"
direct get "s3://$bucket/gw/parts" "$work/parts"
cmp "$work/data" "$work/parts" || fail "the multipart object in Garage differs"
direct get "s3://$bucket/gw/data" "$work/stored"
cmp "$work/data" "$work/stored" || fail "the object in Garage differs"
echo "   Garage holds both, byte-exact"

echo "== 2. haproxy in front of both gateways (each object has one: balance uri, hash-type consistent); gateway 0 killed mid-run"
cat >"$work/haproxy.cfg" <<EOF
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend s3
    bind 192.0.2.1:9100
    default_backend gateways
backend gateways
    balance uri
    hash-type consistent
    server g0 192.0.2.1:9101 check inter 500ms fall 1 rise 2
    server g1 192.0.2.1:9102 check inter 500ms fall 1 rise 2
EOF
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
haproxy_pid=$!
sleep 1
lb=http://192.0.2.1:9100
head -c $((mib << 20)) /dev/urandom >"$work/big"
via "$lb" put "$work/big" "s3://$bucket/gw/big" --no-fallback
# One object, four GETs through haproxy: one gateway serves them all, and
# reads the object from Garage once.
before=$(($(metric 9201 hipobj_s3_cache_bytes_total 'source="upstream"') + $(metric 9202 hipobj_s3_cache_bytes_total 'source="upstream"')))
for i in 1 2 3 4; do
    via "$lb" get "s3://$bucket/gw/big" "$work/hot$i" --no-fallback >/dev/null
    cmp "$work/big" "$work/hot$i" || fail "GET $i of the hot object: bytes differ"
done
after=$(($(metric 9201 hipobj_s3_cache_bytes_total 'source="upstream"') + $(metric 9202 hipobj_s3_cache_bytes_total 'source="upstream"')))
hits=$(($(metric 9201 hipobj_s3_cache_requests_total 'outcome="hit"') + $(metric 9202 hipobj_s3_cache_requests_total 'outcome="hit"')))
((after - before == mib << 20)) || fail "four GETs of one object read $((after - before)) bytes from Garage, not its $((mib << 20)) once"
((hits >= 3)) || fail "four GETs of one object: $hits cache hits"
echo "   four GETs of one object through haproxy: Garage read it once ($((after - before)) bytes), $hits hits"
# Three GETs and three PUTs at once, each bounded; gateway 0 dies under
# them.
jobs=3
for ((i = 0; i < jobs; i++)); do
    (
        rc=0
        timeout 600 "$work/via" "$lb" get "s3://$bucket/gw/big" "$work/got$i" >"$work/get$i.log" 2>&1 || rc=$?
        echo $rc >"$work/get$i.rc"
    ) &
    (
        rc=0
        timeout 600 "$work/via" "$lb" put "$work/big" "s3://$bucket/gw/put$i" >"$work/put$i.log" 2>&1 || rc=$?
        echo $rc >"$work/put$i.rc"
    ) &
done
sleep 2
echo "   killing gateway 0 (pid ${pids[0]}) with transfers in flight"
kill -KILL "${pids[0]}"
wait_start=$SECONDS
while (($(ls "$work"/*.rc 2>/dev/null | wc -l) < 2 * jobs)); do
    ((SECONDS - wait_start < 660)) || fail "a transfer did not end within its bound"
    sleep 1
done
ok=0
failed=0
for ((i = 0; i < jobs; i++)); do
    rc=$(cat "$work/get$i.rc")
    ((rc != 124)) || fail "GET $i hung (timed out): $(tail -3 "$work/get$i.log")"
    if ((rc == 0)); then
        cmp "$work/big" "$work/got$i" || fail "GET $i succeeded with other bytes"
        ok=$((ok + 1))
    else
        echo "   GET $i failed cleanly: $(tail -1 "$work/get$i.log")"
        failed=$((failed + 1))
    fi
    rc=$(cat "$work/put$i.rc")
    ((rc != 124)) || fail "PUT $i hung (timed out): $(tail -3 "$work/put$i.log")"
    # Whatever the PUT's outcome, Garage holds the whole object or nothing.
    if direct get "s3://$bucket/gw/put$i" "$work/stored$i" >/dev/null 2>&1; then
        cmp "$work/big" "$work/stored$i" || fail "PUT $i left a partial object in Garage"
        ((rc == 0)) || echo "   PUT $i failed, yet its object is whole in Garage (stored before the kill reached it)"
    else
        ((rc != 0)) || fail "PUT $i succeeded but Garage does not hold its object"
    fi
    if ((rc == 0)); then ok=$((ok + 1)); else
        echo "   PUT $i failed cleanly: $(tail -1 "$work/put$i.log")"
        failed=$((failed + 1))
    fi
done
for ((i = 0; i < jobs; i++)); do
    grep -h "^hipobj: \(get\|put\) " "$work/get$i.log" "$work/put$i.log" | sed 's/^/   /' || true
done
echo "   $ok transfers succeeded, $failed failed cleanly, none hung, nothing partial in Garage"
for i in 0 1; do
    via "$lb" get "s3://$bucket/gw/big" "$work/after$i" --no-fallback >/dev/null
    cmp "$work/big" "$work/after$i" || fail "GET after the kill: bytes differ"
done
echo "   GETs through haproxy go on on gateway 1"
echo "== gateway checks passed"
((${#bench[@]})) || exit 0

echo "== 3. the benchmark: RDMA GETs through gateway 2 (no cache) and hits of gateway 3 (cached) against Garage's own HTTP GETs from node 1"
start_gateway "${garage_endpoints[1]}" 9103
start_gateway "${garage_endpoints[1]}" 9104 --cache-bytes 805306368 --cache-max-object-bytes 536870912 --cache-validate ttl=3600
c=http://192.0.2.1:9103
cached=http://192.0.2.1:9104
# The gateway's time to first byte is its own histogram's
# (hipobj_s3_rdma_get_first_byte_seconds: from the request's arrival to its
# first RDMA WRITE), read before and after each GET; Garage's is curl's
# time_starttransfer. Throughput is the object over the transfer's time:
# curl's time_total, the command's own "seconds" (one transfer of the whole
# object, --chunk its size, --streams 1, after its HEAD; --no-verify: the
# client's CRC is not the gateway's cost, and the gateway checks the stored
# checksum anyway). The median of each.
node1="${garage_endpoints[1]}"
first_byte() {
    curl -sS "http://192.0.2.1:9203/metrics" | awk '
        $1 == "hipobj_s3_rdma_get_first_byte_seconds_sum" { s = $2 }
        $1 == "hipobj_s3_rdma_get_first_byte_seconds_count" { c = $2 }
        END { print s + 0, c + 0 }'
}
# A process's CPU time so far, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# One RDMA GET of $2 through the gateway at $1 by the command, its rate
# (MiB/s) on stdout.
rdma_rate() {
    local out
    out=$(via "$1" get "s3://$bucket/$2" "$work/bench.rdma" --no-fallback --no-verify \
        --chunk "${size}MiB" --streams 1 --json) || fail "RDMA GET of $2 through $1: $out"
    cmp -s "$work/bench" "$work/bench.rdma" || fail "RDMA GET of $2 through $1: bytes differ"
    python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["mib_per_s"])' <<<"$out"
}
# rdma_rate through the gateway at $2 (its pid $1) of the key $3: the rate
# in $rate, the gateway's CPU ticks it took in $spent.
timed_rdma_rate() {
    local t0
    t0=$(ticks "$1")
    rate=$(rdma_rate "$2" "$3")
    spent=$(($(ticks "$1") - t0))
}
for size in "${bench[@]}"; do
    key="gw/bench-$size"
    head -c $((size << 20)) /dev/urandom >"$work/bench"
    via "$c" put "$work/bench" "s3://$bucket/$key" --no-fallback --no-verify >/dev/null
    # The cache's miss, untimed: every GET after it is a hit.
    rdma_rate "$cached" "$key" >/dev/null
    rounds=$((64 / size))
    ((rounds >= 1)) || rounds=1
    up_rate=() up_first=() gw_rate=() gw_first=() hit_rate=()
    gw_ticks=0 hit_ticks=0 counted=0 plain_rate=()
    # The first size's round 0 warms both up (connections, caches) and is
    # not counted.
    [[ "$size" == "${bench[0]}" ]] && first_round=0 || first_round=1
    for ((round = first_round; round <= rounds; round++)); do
        for turn in 0 1 2 3; do
            case $(((round + turn) % 4)) in
            0)
                out=$(curl -sS --fail-with-body --aws-sigv4 "aws:amz:$HIPOBJ_GARAGE_REGION:s3" \
                    --user "$garage_key:$garage_secret" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
                    -o "$work/bench.http" -w '%{time_starttransfer} %{time_total}' "$node1/$bucket/$key") ||
                    fail "Garage's GET of $key: $out"
                cmp -s "$work/bench" "$work/bench.http" || fail "Garage's GET of $key: bytes differ"
                ((round == 0)) && continue
                read -r first total <<<"$out"
                up_first+=("$first")
                up_rate+=("$(awk -v m="$size" -v t="$total" 'BEGIN { print m / t }')")
                ;;
            1)
                read -r sum0 count0 < <(first_byte)
                timed_rdma_rate "${pids[2]}" "$c" "$key"
                read -r sum1 count1 < <(first_byte)
                ((count1 == count0 + 1)) || fail "gateway 2 recorded $((count1 - count0)) first bytes for one GET"
                ((round == 0)) && continue
                gw_first+=("$(awk -v a="$sum0" -v b="$sum1" 'BEGIN { print b - a }')")
                gw_rate+=("$rate")
                gw_ticks=$((gw_ticks + spent)) counted=$((counted + 1))
                ;;
            3)
                # The same gateway's own plain HTTP GET (curl, SigV4).
                out=$(curl -sS --fail-with-body --aws-sigv4 "aws:amz:us-east-1:s3" \
                    --user "$client_key:$client_secret" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
                    -o "$work/bench.http" -w '%{time_total}' "$c/$bucket/$key") ||
                    fail "gateway 2's plain GET of $key: $out"
                cmp -s "$work/bench" "$work/bench.http" || fail "gateway 2's plain GET of $key: bytes differ"
                ((round == 0)) && continue
                plain_rate+=("$(awk -v m="$size" -v t="$out" 'BEGIN { print m / t }')")
                ;;
            2)
                timed_rdma_rate "${pids[3]}" "$cached" "$key"
                ((round == 0)) && continue
                hit_rate+=("$rate")
                hit_ticks=$((hit_ticks + spent))
                ;;
            esac
        done
    done
    up=$(median "${up_rate[@]}") gw=$(median "${gw_rate[@]}") hit=$(median "${hit_rate[@]}")
    plain=$(median "${plain_rate[@]}")
    uf=$(median "${up_first[@]}") gf=$(median "${gw_first[@]}")
    awk -v size="$size" -v n="$rounds" -v up="$up" -v gw="$gw" -v hit="$hit" -v uf="$uf" -v gf="$gf" -v chunk=8 'BEGIN {
        printf "   %d MiB x%d: Garage %.1f MiB/s, gateway by RDMA %.1f MiB/s, ratio %.3f; cached hits by RDMA %.1f MiB/s, %.2f x Garage\n", size, n, up, gw, gw / up, hit, hit / up
        c = chunk < size ? chunk : size
        printf "   first byte: Garage %.1f ms, gateway %.1f ms (bound: Garage'"'"'s plus one %d MiB chunk at its rate, %.1f ms)\n", uf * 1e3, gf * 1e3, c, (uf + c / up) * 1e3
    }'
    awk -v gw="$gw" -v plain="$plain" 'BEGIN {
        printf "   the same gateway'"'"'s plain HTTP GET %.1f MiB/s: its RDMA GET %.3f of it\n", plain, gw / plain
    }'
    awk -v size="$size" -v n="$counted" -v gw="$gw_ticks" -v hit="$hit_ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        gib = n * size / 1024
        printf "   gateway CPU per GiB served: uncached RDMA GET %.2f s, cached hit %.2f s\n", gw / hz / gib, hit / hz / gib
    }'
done

[[ -n ${HIPOBJ_CACHE_MIB:-} ]] || exit 0
size=$HIPOBJ_CACHE_MIB
echo "== 4. the cache: $size MiB"
upstream_timeout_ms=5000
start_gateway "${garage_endpoints[1]}" 9105 --cache-bytes $((3 * size << 20)) --cache-max-object-bytes $((2 * size << 20))
start_gateway "${garage_endpoints[1]}" 9106 --cache-bytes $((3 * size << 20)) --cache-max-object-bytes $((2 * size << 20)) --cache-validate ttl=3600
always=http://192.0.2.1:9105 trusting=http://192.0.2.1:9106
mkdir -p "$work/local/$bucket"
"$server_bin" --root "$work/local" --listen 192.0.2.1:9107 --device rxe0 \
    --access-key "$client_key" --secret-key "$client_secret" >"$work/local.out" 2>"$work/local.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "http://" "$work/local.out" 2>/dev/null && break; sleep 0.2; done
local_backend=http://192.0.2.1:9107
key="gw/cache-$size"
head -c $((size << 20)) /dev/urandom >"$work/bench"
via "$c" put "$work/bench" "s3://$bucket/$key" --no-fallback --no-verify >/dev/null
via "$local_backend" put "$work/bench" "s3://$bucket/$key" --no-fallback --no-verify >/dev/null
# a. 8 clients at once, the object not cached yet.
started=$EPOCHREALTIME
readers=()
for i in 1 2 3 4 5 6 7 8; do
    timeout 600 "$work/via" "$always" get "s3://$bucket/$key" "$work/cold.$i" --no-fallback \
        --chunk "${size}MiB" --streams 1 >"$work/cold.$i.out" 2>&1 &
    readers+=($!)
done
for i in "${!readers[@]}"; do
    wait "${readers[$i]}" || fail "cold reader $((i + 1)) failed: $(cat "$work/cold.$((i + 1)).out")"
done
took=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
for i in 1 2 3 4 5 6 7 8; do
    cmp -s "$work/bench" "$work/cold.$i" ||
        fail "cold reader $i: bytes differ ($(cmp "$work/bench" "$work/cold.$i" 2>&1 | head -1); $(stat -c %s "$work/cold.$i") bytes): $(cat "$work/cold.$i.out")"
    rm -f "$work/cold.$i"
done
gets=$(metric 9205 hipobj_s3_upstream_request_duration_seconds_count 'op="GetObject"')
filled=$(metric 9205 hipobj_s3_cache_bytes_total 'source="upstream"')
joined=$(metric 9205 hipobj_s3_cache_coalesced_readers_total)
echo "   8 readers of a cold $size MiB object at once: all byte-exact in $took s; the store's GETs $gets, bytes it sent $filled, readers that joined a fill $joined"
((gets == 1 && filled == size << 20)) || fail "the store served the object $gets times ($filled bytes)"
# b. Cached GETs against a local-backend server's RDMA GETs.
rdma_rate "$trusting" "$key" >/dev/null
hit_rate=() local_rate=()
for round in 1 2 3; do
    hit_rate+=("$(rdma_rate "$trusting" "$key")")
    local_rate+=("$(rdma_rate "$local_backend" "$key")")
done
hit=$(median "${hit_rate[@]}") here=$(median "${local_rate[@]}")
awk -v size="$size" -v hit="$hit" -v here="$here" 'BEGIN {
    printf "   %d MiB by RDMA: cached hit %.1f MiB/s, the local backend %.1f MiB/s, ratio %.3f\n", size, hit, here, hit / here
}'
# c. An application's GETs, its buffer registered once (as a model loader's
# or a data loader's, unlike the command's GETs above, each of which
# registers fresh memory): `hipobj bench`, one stream, by RDMA and by plain
# HTTP (--http: the same tool without the library), through gateway 2
# (uncached) and the trusting gateway (hits); the median GET of each.
warm() { # endpoint, label, extra bench options...
    local out
    out=$(AWS_ACCESS_KEY_ID=$client_key AWS_SECRET_ACCESS_KEY=$client_secret AWS_REGION=us-east-1 \
        AWS_ENDPOINT_URL="$1" "$hipobj" bench "s3://$bucket/gw/warm" --sizes 16MiB,64MiB \
        --streams-list 1 --count 3 --ops get --no-verify --json "${@:3}" 2>"$work/warm.err") ||
        fail "hipobj bench through $1 ($2): $(tail -3 "$work/warm.err")"
    python3 -c '
import json, sys
for c in json.load(sys.stdin)["cells"]:
    print(sys.argv[1], c["size"] >> 20, round((c["size"] >> 20) / (c["p50_us"] / 1e6), 1))' "$2" <<<"$out"
}
{
    warm "$c" rdma
    warm "$c" http --http
    warm "$trusting" hit_rdma
    warm "$trusting" hit_http --http
} >"$work/warm"
for mib in 16 64; do
    awk -v mib="$mib" '$2 == mib { r[$1] = $3 } END {
        printf "   %d MiB, warm buffers (median GET): uncached RDMA %.1f MiB/s, its plain HTTP %.1f MiB/s: %.3f; hits RDMA %.1f, HTTP %.1f: %.3f\n",
            mib, r["rdma"], r["http"], r["rdma"] / r["http"], r["hit_rdma"], r["hit_http"], r["hit_rdma"] / r["hit_http"]
    }' "$work/warm"
done
# d. Garage's node 1 (both gateways' store) stopped.
node=$(cat "$HIPOBJ_GARAGE_DIR/node1/pid")
rdma_rate "$always" "$key" >/dev/null
kill -STOP "$node"
started=$EPOCHREALTIME
out=$(timeout 120 "$work/via" "$trusting" get "s3://$bucket/$key" "$work/bench.rdma" --no-fallback --retries 0 2>&1) ||
    { kill -CONT "$node"; fail "ttl, the store stopped: $out"; }
cmp -s "$work/bench" "$work/bench.rdma" || { kill -CONT "$node"; fail "ttl, the store stopped: bytes differ"; }
served=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
started=$EPOCHREALTIME
status=0
out=$(timeout 120 "$work/via" "$always" get "s3://$bucket/$key" "$work/bench.rdma" --no-fallback --retries 0 2>&1) || status=$?
refused=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
kill -CONT "$node"
((status != 0 && status != 124)) || fail "always, the store stopped: status $status (124: it hung): $out"
grep -q 503 <<<"$out" || fail "always, the store stopped: not a 503: $out"
echo "   Garage's node stopped: ttl served the object in $served s; always answered 503 in $refused s (--upstream-timeout-ms 5000): $(tail -1 <<<"$out")"

