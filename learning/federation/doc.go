// Package federation improves adapters together without moving data:
// participants exchange adapter deltas, an aggregator averages them by
// FedAvg weighted by sample counts (McMahan, Moore, Ramage, Hampson and
// Agüera y Arcas, "Communication-Efficient Learning of Deep Networks from
// Decentralized Data", AISTATS 2017), and the average comes back as a new
// adapter version that each participant evaluates on its own held-out
// probes and promotes only through the same gate as a locally trained one
// (learning/eval Gate, learning/adapters Store).
//
// # What is exchanged: products, not factors
//
// A LoRA adapter updates a base matrix W [Out][In] by ΔW = s·B·A with
// B [Out][r], A [r][In] and s = alpha/r (Hu et al., 2021). A Delta carries,
// per adapted matrix, the product ΔW itself, not A and B. The factorisation
// is not unique — B·A = (B·R)(R⁻¹·A) for any invertible R — so two
// participants who learnt the same update may hold unrelated factors, and
// averaging factors computes mean(B)·mean(A) = (1/k²)·Σᵢ Σⱼ Bᵢ·Aⱼ: cross
// terms Bᵢ·Aⱼ of one participant's B with another's A that no participant
// trained, and not the FedAvg of the updates, (1/k)·Σᵢ Bᵢ·Aᵢ. Averaging
// products is exactly FedAvg on the weights the model runs with. The price
// is size: Out·In numbers per matrix instead of r·(Out+In), bounded by
// MaxDeltaBytes. The weighted average of k rank-r products has rank up to
// k·r; Aggregate re-factorises it to rank r by truncated SVD, which is the
// best rank-r approximation in Frobenius norm (Eckart–Young), and reports
// the share of the average's energy the truncation kept.
//
// Deltas are relative to the base: each participant's ΔW is its whole
// adapter's update of the base, so a round averages the participants'
// current adapters of a domain. (Local training warm-started from the
// previous aggregate would make rounds iterate FedAvg proper; lora.Train
// starts from B = 0.)
//
// # Wire format
//
// EncodeDelta writes "MOLLY-FED-DELTA-1\n", a little-endian uint32 length,
// a JSON header (Header: round, domain, base checksum and quantization,
// sample count, rank, element type, and each tensor's name and shape),
// then each tensor's Out·In values row-major as little-endian IEEE 754
// binary16 (f16, the default) or binary32 (f32). No text other than the
// header's identifiers is ever written: no trace, prompt, curated pair or
// token.
//
// # Differential privacy
//
// With DP set, a participant clips the L2 norm of its whole update (all
// matrices concatenated) to C and adds Gaussian noise N(0, σ²C²) to every
// coordinate before the update leaves it (local DP: the aggregator need not
// be trusted). The unit protected is the participant's whole local data
// set: replacing it moves the clipped update by at most 2C in L2. The
// Accountant composes rounds in Rényi DP — the Gaussian mechanism of L2
// sensitivity Δ and noise standard deviation σC is (α, αΔ²/(2σ²C²))-RDP
// (Mironov, "Rényi Differential Privacy", CSF 2017, Proposition 7), RDP
// composes additively (Proposition 1) — and converts to (ε, δ)-DP by
// ε = min over α of RDP(α) + log(1/δ)/(α−1) (Proposition 3). A configured
// ε budget stops participation before a round would exceed it.
package federation
