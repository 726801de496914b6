// SPDX-License-Identifier: GPL-2.0
/*
 * The BPF patch panel: circuits whose dark windows the kernel times.
 *
 * A map entry (struct circuit) says where a port's frames go *as a function
 * of time*, so a reconfiguration is one map write made ahead of time, and the
 * kernel switches at the packet's arrival on its own CLOCK_MONOTONIC
 * (bpf_ktime_get_ns), however late the controller's process runs afterwards.
 *
 *   ocs_panel     an OCS port's ingress: the circuit of that port
 *                 (map "ports", keyed by ingress ifindex) -> redirect or drop
 *   tor_timeflow  a ToR's host-facing ports: the circuit towards the frame's
 *                 IPv4 destination (map "dests") -> uplink, or the kernel routes
 *   tor_uplink    a ToR's uplinks: a frame for a host of another ToR arrived
 *                 by a rotor circuit lit to the wrong ToR -> drop
 *   arm           run by the controller (BPF_PROG_TEST_RUN), not by packets:
 *                 anchors every "arming" entry of `ports` on the kernel's now
 *
 * Why `arm`: a reconfiguration written with absolute times must reach the
 * map before its dark window opens, and a controller process stalled by a
 * loaded machine wrote them up to 7 ms late here (the window then opened at
 * the write: shorter than asked).  So the controller writes *relative* times
 * (mode ARMING: the old circuit stays lit meanwhile), then runs `arm`, which
 * reads the clock in the kernel and makes them absolute in one pass over the
 * map, microseconds wide.  However late that happens, the window it opens is
 * exactly as long as asked; a stall only moves it.
 *
 * The layout of struct circuit is an ABI: controllers/bpf/entry.py packs it.
 * Build: python -m controllers.bpf.build (clang -O2 -g -target bpf).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_SLOTS 32
#define MODE_TIMED 0
#define MODE_CYCLIC 1
#define MODE_ARMING 2            /* timed, its times relative to the next `arm` */
#define FOREVER 0xffffffffffffffffULL

struct circuit {
	__u32 mode;              /* 0 = timed, 1 = cyclic */
	__u32 nslots;            /* cyclic: slots per cycle, 1..MAX_SLOTS */
	__u32 peer_now;          /* timed: ifindex lit until dark_at (0: none) */
	__u32 peer_next;         /* timed: ifindex lit from lit_at (0: none) */
	__u64 dark_at;           /* timed: CLOCK_MONOTONIC ns at which peer_now goes dark */
	__u64 lit_at;            /* timed: CLOCK_MONOTONIC ns from which peer_next is lit */
	__u64 epoch;             /* cyclic: ns at which slot 0 starts (its guard first) */
	__u64 period;            /* cyclic: one slot including its guard, ns (> 0) */
	__u64 guard;             /* cyclic: dark ns at the start of every slot (< period) */
	__u32 peers[MAX_SLOTS];  /* cyclic: ifindex per slot (0: no circuit in that slot) */
};

/* Python packs the entry with struct "=IIIIQQQQQ32I": a change here breaks it. */
_Static_assert(sizeof(struct circuit) == 184, "struct circuit is an ABI of 184 bytes");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);                 /* ingress ifindex */
	__type(value, struct circuit);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);                 /* IPv4 daddr as in the packet (network order) */
	__type(value, struct circuit);
} dests SEC(".maps");

enum { STAT_REDIRECTED, STAT_DARK, STAT_NO_ENTRY, STAT_PASSED, NSTATS };

/* Per CPU: counting costs no atomic operation; the reader sums the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&stats, &which);

	if (n)
		*n += 1;
}

/*
 * The ifindex the circuit leads to at `now`, 0 while dark.  A cyclic entry
 * keeps its timed fields' meaning until its epoch, so a schedule written
 * ahead of time leaves the present circuit lit until it starts.
 * entry.peer_at in Python mirrors this function; the unit tests compare them.
 */
static __always_inline __u32 peer_at(const struct circuit *c, __u64 now)
{
	if (c->mode == MODE_ARMING)     /* not anchored yet: the change has not begun */
		return c->peer_now;
	if (c->mode == MODE_CYCLIC && now >= c->epoch) {
		__u64 off, k;

		if (c->nslots == 0 || c->period == 0)
			return 0;
		off = now - c->epoch;
		k = off / c->period;
		if (off - k * c->period < c->guard)
			return 0;
		/* The mask bounds the index for the verifier; nslots <= MAX_SLOTS. */
		return c->peers[(k % c->nslots) & (MAX_SLOTS - 1)];
	}
	if (now < c->dark_at)
		return c->peer_now;
	if (now >= c->lit_at)
		return c->peer_next;
	return 0;
}

/* Redirect to the egress of `peer`, or drop while the circuit is dark. */
static __always_inline int follow(const struct circuit *c)
{
	__u32 peer = peer_at(c, bpf_ktime_get_ns());

	if (!peer) {
		count(STAT_DARK);
		return TC_ACT_SHOT;
	}
	count(STAT_REDIRECTED);
	return bpf_redirect(peer, 0);
}

/* The IPv4 destination of an Ethernet frame; 0 when it is not IPv4 (or too short). */
static __always_inline int ipv4_daddr(struct __sk_buff *skb, __u32 *daddr)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	*daddr = ip->daddr;
	return 1;
}

/*
 * An OCS port.  At tc ingress skb->ingress_ifindex (skb_iif) and skb->ifindex
 * (skb->dev) are both the port the frame came in on: __netif_receive_skb_core
 * sets skb_iif = dev->ifindex before the ingress hook.  ingress_ifindex is the
 * one BPF_PROG_TEST_RUN lets a test set to any port number.  No entry means
 * no circuit: an OCS without a lit mirror passes no light.
 */
SEC("tc")
int ocs_panel(struct __sk_buff *skb)
{
	__u32 port = skb->ingress_ifindex;
	struct circuit *c = bpf_map_lookup_elem(&ports, &port);

	if (!c) {
		count(STAT_NO_ENTRY);
		return TC_ACT_SHOT;
	}
	return follow(c);
}

/* A ToR's host port: a destination with a schedule follows it, the rest is routed. */
SEC("tc")
int tor_timeflow(struct __sk_buff *skb)
{
	__u32 daddr;
	struct circuit *c;

	if (!ipv4_daddr(skb, &daddr))
		goto pass;
	c = bpf_map_lookup_elem(&dests, &daddr);
	if (!c)
		goto pass;
	return follow(c);
pass:
	count(STAT_PASSED);
	return TC_ACT_OK;
}

/*
 * A ToR's uplink.  `dests` holds the hosts of *other* ToRs (this ToR's own
 * hosts are routed, never scheduled), so a frame for one of them came over a
 * circuit lit to the wrong ToR: drop it rather than route it back out.
 */
SEC("tc")
int tor_uplink(struct __sk_buff *skb)
{
	__u32 daddr;

	if (ipv4_daddr(skb, &daddr) && bpf_map_lookup_elem(&dests, &daddr)) {
		count(STAT_NO_ENTRY);
		return TC_ACT_SHOT;
	}
	count(STAT_PASSED);
	return TC_ACT_OK;
}

/* When the last `arm` ran (CLOCK_MONOTONIC ns): the controller reads it back. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} armed_at SEC(".maps");

static long arm_one(struct bpf_map *map, __u32 *key, struct circuit *c, __u64 *now)
{
	if (c->mode != MODE_ARMING)
		return 0;
	if (c->dark_at != FOREVER)
		c->dark_at += *now;
	if (c->lit_at != FOREVER)
		c->lit_at += *now;
	/* The times first, the mode last: a packet on another CPU sees either the
	 * arming entry (old circuit) or the finished one, never relative times
	 * taken as absolute.  x86 keeps stores in order; this keeps the compiler
	 * from reordering them. */
	asm volatile("" ::: "memory");
	c->mode = MODE_TIMED;
	return 0;
}

SEC("syscall")
int arm(void *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;

	bpf_for_each_map_elem(&ports, arm_one, &now, 0);
	bpf_map_update_elem(&armed_at, &zero, &now, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
