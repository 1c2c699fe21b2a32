// See model.h.
#include "worker/nn/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "common/errors.h"
#include "worker/nn/layer_builders.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

std::vector<ParamRange> Layer::gradient_pieces() const {
  size_t count = 0;
  for (const ParamInfo& p : params()) count += p.count;
  if (count == 0) return {};
  return {{0, count}};
}

Model::Model(const ModelSpec& spec, Backend& backend, int max_batch, float* gradient_memory,
             size_t gradient_floats)
    : spec_(spec), backend_(backend), max_batch_(max_batch) {
  const size_t n = spec_.nodes.size();
  DT_ENFORCE(n > 0, "a model without layers");
  output_ = n - 1;
  if (backend.device().kind() == DeviceKind::kCuda) {
    if (const NodeSpec* untested = spec_.first_gpu_untested())
      throw common::ConfigError(gpu_untested_reason(*untested));
  }
  for (size_t i = 0; i < n; ++i) {
    const NodeSpec& node = spec_.nodes[i];
    layers_.push_back(
        make_layer(node, spec_.input_dims_of(i), {static_cast<int>(i), max_batch, backend}));
    has_random_layers_ |= node.config->draws_randomness();
  }
  const std::array<size_t, 3> floats = lay_out();  // parameters, state, statistics
  Device& device = backend.device();
  parameters_ = Buffer<float>(device, floats[0]);
  if (floats[1] > 0) state_ = Buffer<float>(device, floats[1]);
  if (floats[2] > 0) statistics_ = Buffer<float>(device, floats[2]);
  move_gradients(gradient_memory, gradient_floats);
  fuse();
  plan_memory();
  choose_layouts();
  plan_rounded_copies();
}

Model::~Model() = default;

namespace {

// Places a layer's tensors at offset of one flat buffer, named by the layer's prefix; appends
// them to all and returns their range.
ParamRange place(const std::string& prefix, std::vector<ParamInfo> tensors, size_t offset,
                 std::vector<ParamInfo>& all) {
  ParamRange range{offset, 0};
  for (ParamInfo& info : tensors) {
    info.name = prefix + info.name;
    info.offset += offset;
    range.count += info.count;
    all.push_back(std::move(info));
  }
  return range;
}

}  // namespace

std::array<size_t, 3> Model::lay_out() {
  std::array<size_t, 3> floats{0, 0, 0};
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string& prefix = spec_.nodes[i].param_prefix;
    ranges_.push_back(place(prefix, layers_[i]->params(), floats[0], infos_));
    state_ranges_.push_back(place(prefix, layers_[i]->state(), floats[1], state_infos_));
    statistics_ranges_.push_back({floats[2], layers_[i]->statistics_count()});
    floats[0] += ranges_.back().count;
    floats[1] += state_ranges_.back().count;
    floats[2] += statistics_ranges_.back().count;
  }
  first_piece_.assign(layers_.size(), 0);
  for (size_t i = layers_.size(); i-- > 0;) {
    first_piece_[i] = pieces_.size();
    for (const ParamRange& piece : layers_[i]->gradient_pieces())
      pieces_.push_back({ranges_[i].offset + piece.offset, piece.count, i});
  }
  return floats;
}

void Model::fuse() {
  const size_t n = layers_.size();
  view_.assign(n, false);
  std::vector<int> users(n, 0);
  for (size_t i = 0; i < n; ++i) {
    view_[i] = layers_[i]->is_view();
    for (size_t in : spec_.nodes[i].inputs)
      if (in != NodeSpec::kModelInput) ++users[in];
  }
  for (size_t i = 0; i < n; ++i) {
    if (!layers_[i]->is_relu() || spec_.nodes[i].inputs.size() != 1) continue;
    size_t in = spec_.nodes[i].inputs[0];
    if (in == NodeSpec::kModelInput || view_[in] || users[in] != 1 || in == output_) continue;
    if (layers_[in]->fuse_relu()) view_[i] = true;
  }
  // An add of two inputs into the later one, p, when the add is p's only user, the other input
  // comes before p (the model's input, or an earlier node), and p can take the add in: p writes
  // the add's output, and the add's forward is skipped.
  forward_done_.assign(n, false);
  add_taken_.assign(n, kNone);
  std::vector<bool> relu_in(n, false);  // a ReLU fused into the node
  for (size_t i = 0; i < n; ++i)
    if (view_[i] && layers_[i]->is_relu()) relu_in[spec_.nodes[i].inputs[0]] = true;
  for (size_t a = 0; a < n; ++a) {
    const std::vector<size_t>& ins = spec_.nodes[a].inputs;
    if (view_[a] || !layers_[a]->is_add() || ins.size() != 2) continue;
    const size_t p = ins[0] == NodeSpec::kModelInput                      ? ins[1]
                     : ins[1] == NodeSpec::kModelInput || ins[0] > ins[1] ? ins[0]
                                                                          : ins[1];
    if (p == NodeSpec::kModelInput || ins[0] == ins[1] || view_[p] || users[p] != 1) continue;
    if (layers_[p]->fuse_add(relu_in[a])) {
      forward_done_[a] = true;
      add_taken_[p] = a;
    }
  }
}

void Model::plan_memory() {
  const size_t n = layers_.size();
  Device& device = backend_.device();
  root_.assign(n, kInput);
  activations_.assign(n, nullptr);
  deltas_.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (view_[i]) {
      size_t in = spec_.nodes[i].inputs[0];
      root_[i] = in == NodeSpec::kModelInput ? kInput : root_[in];
      if (root_[i] != kInput)
        activations_[i] = activations_[root_[i]], deltas_[i] = deltas_[root_[i]];
      continue;
    }
    root_[i] = i;
    size_t count = spec_.nodes[i].out.size() * static_cast<size_t>(max_batch_);
    if (add_taken_[i] == kNone) {  // else it writes the add's output (fuse)
      storage_.emplace_back(device, count);
      activations_[i] = storage_.back().data();
    }
    storage_.emplace_back(device, count);
    deltas_[i] = storage_.back().data();
  }
  for (size_t i = 0; i < n; ++i)
    if (add_taken_[i] != kNone) activations_[i] = activations_[add_taken_[i]];
  if (root_[output_] == kInput)
    throw common::ConfigError(
        fmt::format("{}: the model's output is its input; add a layer", spec_.nodes[output_].path));
  // A node's output needs a gradient when it or a node before it has parameters; backward skips
  // the others, and nobody computes a gradient for them (an augmentation layer's, or the first
  // convolution's dx).
  needs_gradient_.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    bool needs = ranges_[i].count > 0;
    for (size_t in : spec_.nodes[i].inputs)
      needs = needs || (in != NodeSpec::kModelInput && needs_gradient_[in]);
    needs_gradient_[i] = needs;
  }
  // Backward runs the nodes last to first; the first to reach an input's gradient writes it, the
  // others add theirs.
  std::vector<bool> written(n, false);
  size_t scratch = 0;
  accumulates_.assign(n, {});
  inputs_.assign(n, {});
  input_deltas_.assign(n, {});
  for (size_t i = n; i-- > 0;) {
    const std::vector<size_t>& ins = spec_.nodes[i].inputs;
    inputs_[i].assign(ins.size(), nullptr);
    input_deltas_[i].assign(ins.size(), nullptr);
    accumulates_[i].assign(ins.size(), false);
    if (view_[i] || !needs_gradient_[i]) continue;
    for (size_t s = 0; s < ins.size(); ++s) {
      size_t r = ins[s] == NodeSpec::kModelInput ? kInput : root_[ins[s]];
      if (r == kInput || !needs_gradient_[r]) continue;
      if (written[r]) {
        accumulates_[i][s] = true;
        scratch = std::max(scratch, spec_.nodes[r].out.size() * static_cast<size_t>(max_batch_));
      }
      written[r] = true;
    }
  }
  if (scratch > 0) scratch_ = Buffer<float>(device, scratch);
  share_gradients();
  defer_last_shares();
}

void Model::defer_last_shares() {
  const size_t n = layers_.size();
  defers_.assign(n, {});
  pending_.assign(n, nullptr);
  std::vector<size_t> first_user(n, n);  // each root's earliest user that is not a view
  for (size_t j = n; j-- > 0;) {
    if (view_[j]) continue;
    for (size_t in : spec_.nodes[j].inputs)
      if (in != NodeSpec::kModelInput && root_[in] != kInput) first_user[root_[in]] = j;
  }
  auto adds = [&](size_t k) {
    return std::count(accumulates_[k].begin(), accumulates_[k].end(), true);
  };
  for (size_t i = 0; i < n; ++i) {
    const std::vector<size_t>& ins = spec_.nodes[i].inputs;
    defers_[i].assign(ins.size(), false);
    if (adds(i) != 1) continue;
    for (size_t s = 0; s < ins.size(); ++s) {
      if (!accumulates_[i][s]) continue;
      const size_t r = root_[ins[s]];
      // i adds the last share (no user comes before it); r takes it as its dy_addend, writes
      // none of its own inputs' gradients into scratch (it would overwrite the share), and
      // nothing between r and i in node order adds through scratch.
      if (first_user[r] != i || !layers_[r]->takes_gradient_addend() || adds(r) != 0 ||
          r == root_[output_])
        continue;
      bool untouched = true;
      for (size_t k = r + 1; k < i; ++k) untouched &= adds(k) == 0;
      defers_[i][s] = untouched;
    }
  }
}

void Model::share_gradients() {
  const size_t n = layers_.size();
  // Each root's users (through views), in node order.
  std::vector<std::vector<size_t>> users(n);
  for (size_t j = 0; j < n; ++j) {
    if (view_[j]) continue;
    for (size_t in : spec_.nodes[j].inputs)
      if (in != NodeSpec::kModelInput && root_[in] != kInput) users[root_[in]].push_back(j);
  }
  std::vector<bool> shared(n, false);
  for (size_t a = 0; a < n; ++a) {
    if (view_[a] || !needs_gradient_[a] || !layers_[a]->same_gradient_to_inputs()) continue;
    const std::vector<size_t>& ins = spec_.nodes[a].inputs;
    // p's gradient becomes q's buffer when: a writes both first (no other share in them yet), a
    // is p's only user (nothing adds into p's gradient), and q's other users all come before p
    // (their shares are added into q's gradient after p's backward has read its own; p itself
    // is not one). Neither is the model's output, whose gradient the loss writes.
    for (size_t sp = 0; sp < ins.size(); ++sp) {
      for (size_t sq = 0; sq < ins.size(); ++sq) {
        if (ins[sp] == NodeSpec::kModelInput || ins[sq] == NodeSpec::kModelInput) continue;
        const size_t p = root_[ins[sp]], q = root_[ins[sq]];
        if (p == q || p == kInput || q == kInput || shared[p] || shared[q]) continue;
        if (!needs_gradient_[p] || !needs_gradient_[q] || accumulates_[a][sp] ||
            accumulates_[a][sq] || p == root_[output_] || q == root_[output_])
          continue;
        if (users[p] != std::vector<size_t>{a}) continue;
        bool before_p = true;
        for (size_t u : users[q]) before_p &= u == a || u < p;
        if (!before_p) continue;
        deltas_[p] = deltas_[q];
        shared[p] = shared[q] = true;
      }
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (view_[i] && root_[i] != kInput) deltas_[i] = deltas_[root_[i]];
}

void Model::choose_layouts() {
  const size_t n = layers_.size();
  layouts_.assign(n, Layout::kPlain);
  auto root_of = [&](size_t in) { return in == NodeSpec::kModelInput ? kInput : root_[in]; };
  std::vector<bool> blocked(n, false);
  if (backend_.blocks_channels()) {
    // Each node's users, through the ReLUs fused into it; a view that reinterprets its input
    // (flatten) needs it plain.
    std::vector<std::vector<size_t>> users(n);
    std::vector<bool> plain_only(n, false);
    for (size_t j = 0; j < n; ++j) {
      for (size_t in : spec_.nodes[j].inputs) {
        const size_t r = root_of(in);
        if (r == kInput) continue;
        if (view_[j] && layers_[j]->is_view()) plain_only[r] = true;
        if (!view_[j]) users[r].push_back(j);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const Blocking b = layers_[i]->blocking();
      const Dims& d = spec_.nodes[i].out;
      blocked[i] = !view_[i] && (b == Blocking::kAny || b == Blocking::kFollows) && !d.sequence &&
                   !d.flat() && d.c % kChannelBlock == 0 && i != root_[output_] && !plain_only[i];
    }
    // Unblock, until nothing changes, what a user cannot read blocked and what follows a plain
    // input (a node that follows shares one layout with all its inputs).
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < n; ++i) {
        if (!blocked[i]) continue;
        bool keep = true;
        for (size_t j : users[i]) {
          const Blocking b = layers_[j]->blocking();
          keep &= b != Blocking::kNone && (b != Blocking::kFollows || blocked[j]);
        }
        if (layers_[i]->blocking() == Blocking::kFollows) {
          for (size_t in : spec_.nodes[i].inputs) {
            const size_t r = root_of(in);
            keep &= r != kInput && blocked[r];
          }
        }
        if (!keep) blocked[i] = false, changed = true;
      }
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (blocked[i]) layouts_[i] = Layout::kBlocked;
  for (size_t i = 0; i < n; ++i) {
    if (view_[i]) continue;
    std::vector<Layout> in;
    for (size_t x : spec_.nodes[i].inputs) {
      const size_t r = root_of(x);
      in.push_back(r == kInput ? Layout::kPlain : layouts_[r]);
    }
    layers_[i]->set_layouts(in, layouts_[i]);
  }
}

void Model::plan_rounded_copies() {
  const size_t n = layers_.size();
  rounded_activations_.assign(n, {});
  rounded_deltas_.assign(n, {});
  writes_y_rounded_.assign(n, nullptr);
  writes_dx_rounded_.assign(n, nullptr);
  reads_x_rounded_.assign(n, nullptr);
  reads_dy_rounded_.assign(n, nullptr);
  dx_rounded_reader_.assign(n, kNone);
  y_rounded_readers_.assign(n, {});
  if (!backend_.makes_rounded_copies()) return;
  auto root_of = [&](size_t in) { return in == NodeSpec::kModelInput ? kInput : root_[in]; };
  // The node whose forward writes each root's memory: itself, or the node that took it (an add)
  // in; and each root's users that are not views, through views.
  std::vector<size_t> writer(n);
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; ++i) writer[i] = i;
  for (size_t p = 0; p < n; ++p)
    if (add_taken_[p] != kNone) writer[add_taken_[p]] = p;
  for (size_t j = 0; j < n; ++j) {
    if (view_[j]) continue;
    for (size_t in : spec_.nodes[j].inputs)
      if (root_of(in) != kInput) users[root_of(in)].push_back(j);
  }
  auto reader_of = [&](size_t j, size_t r) {
    return layers_[j]->reads_rounded() && root_of(spec_.nodes[j].inputs[0]) == r;
  };
  for (size_t r = 0; r < n; ++r) {
    if (view_[r] || !layers_[writer[r]]->writes_rounded()) continue;
    if (std::none_of(users[r].begin(), users[r].end(), [&](size_t j) { return reader_of(j, r); }))
      continue;
    rounded_activations_[r].resize(spec_.nodes[r].out.size() * static_cast<size_t>(max_batch_));
    writes_y_rounded_[writer[r]] = rounded_activations_[r].data();
    for (size_t j : users[r])
      if (reader_of(j, r)) reads_x_rounded_[j] = rounded_activations_[r].data();
    // Every user reads the copy, and the float is nobody else's: not the model's output, and
    // written by r itself (a sum an add-taking node writes is its own).
    if (writer[r] == r && r != root_[output_] &&
        std::all_of(users[r].begin(), users[r].end(), [&](size_t j) { return reader_of(j, r); }))
      y_rounded_readers_[r] = users[r];
  }
  // A reader's output gradient, when its one user is a writer with that one input, which writes
  // the whole gradient (adds nothing into it), and no other node's gradient is that buffer.
  for (size_t c = 0; c < n; ++c) {
    if (view_[c] || !layers_[c]->reads_rounded() || !needs_gradient_[c] || c == root_[output_] ||
        users[c].size() != 1)
      continue;
    const size_t u = users[c][0];
    if (spec_.nodes[u].inputs.size() != 1 || !layers_[u]->writes_rounded() || accumulates_[u][0] ||
        defers_[u][0])
      continue;
    bool alone = true;
    for (size_t r = 0; r < n; ++r) alone &= r == c || view_[r] || deltas_[r] != deltas_[c];
    if (!alone) continue;
    rounded_deltas_[c].resize(spec_.nodes[c].out.size() * static_cast<size_t>(max_batch_));
    writes_dx_rounded_[u] = rounded_deltas_[c].data();
    reads_dy_rounded_[c] = rounded_deltas_[c].data();
    dx_rounded_reader_[u] = c;
  }
}

std::array<size_t, 2> Model::rounded_copies() const {
  auto kept = [](const std::vector<std::vector<uint16_t>>& copies) {
    return static_cast<size_t>(
        std::count_if(copies.begin(), copies.end(), [](const auto& c) { return !c.empty(); }));
  };
  return {kept(rounded_activations_), kept(rounded_deltas_)};
}

void Model::move_gradients(float* gradient_memory, size_t gradient_floats) {
  Device& device = backend_.device();
  size_t count = parameters_.size();
  if (gradient_memory != nullptr && count <= gradient_floats) {
    gradients_ = Buffer<float>(device, gradient_memory, count);
    device.fill_zero(gradient_memory, count * sizeof(float));  // as fresh device memory is
  } else if (gradients_.size() != count || !gradients_.owned()) {
    gradients_ = Buffer<float>(device, count);
  }
}

void Model::initialize(uint64_t seed) {
  std::vector<float> host(parameters_.size(), 0.0f), state(state_.size(), 0.0f);
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->initialize(host.data() + ranges_[i].offset, state.data() + state_ranges_[i].offset,
                           random_key(seed, 0x1a7e5, i));
  }
  parameters_.from_host(host);
  state_.from_host(state);
}

const float* Model::forward(const float* images, int n, const StepKey& key, bool training) {
  DT_ENFORCE(n > 0 && n <= max_batch_, "batch of {} for a model built for {}", n, max_batch_);
  grouped_forward_ = training && group_sum_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (view_[i]) continue;
    const std::vector<size_t>& ins = spec_.nodes[i].inputs;
    for (size_t s = 0; s < ins.size(); ++s) {
      size_t r = ins[s] == NodeSpec::kModelInput ? kInput : root_[ins[s]];
      inputs_[i][s] = r == kInput ? images : activations_[r];
    }
    if (forward_done_[i]) continue;  // its input took it in, and wrote its output
    const float* addend = nullptr;   // the other input of the add this node took in
    if (add_taken_[i] != kNone) {
      const std::vector<size_t>& add_ins = spec_.nodes[add_taken_[i]].inputs;
      const size_t q = add_ins[0] == i ? add_ins[1] : add_ins[0];
      addend = q == NodeSpec::kModelInput ? images : activations_[root_[q]];
    }
    ForwardArgs args{n,
                     inputs_[i],
                     const_cast<float*>(activations_[i]),
                     ranges_[i].count ? parameters_.data() + ranges_[i].offset : nullptr,
                     state_ranges_[i].count ? state_.data() + state_ranges_[i].offset : nullptr,
                     key,
                     training,
                     training && statistics_ranges_[i].count
                         ? statistics_.data() + statistics_ranges_[i].offset
                         : nullptr,
                     grouped_forward_ ? &group_sum_ : nullptr,
                     addend};
    if (training) {
      args.y_rounded = writes_y_rounded_[i];
      args.x_rounded = reads_x_rounded_[i];
      const std::vector<size_t>& readers = y_rounded_readers_[i];
      args.y_rounded_only = args.y_rounded && !readers.empty() &&
                            std::all_of(readers.begin(), readers.end(), [&](size_t j) {
                              return layers_[j]->reads_only_rounded_x(backend_, n);
                            });
    }
    layers_[i]->forward(backend_, args);
  }
  return activations_[root_[output_]];
}

void Model::update_state(int shards) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (statistics_ranges_[i].count == 0) continue;
    layers_[i]->update_state(backend_, statistics_.data() + statistics_ranges_[i].offset, shards,
                             state_.data() + state_ranges_[i].offset);
  }
}

void Model::backward(int n, const std::function<void(size_t piece)>& gradients_enqueued) {
  const GroupSum* group = grouped_forward_ ? &group_sum_ : nullptr;
  std::fill(pending_.begin(), pending_.end(), nullptr);
  for (size_t i = layers_.size(); i-- > 0;) {
    if (view_[i] || !needs_gradient_[i]) continue;
    const std::vector<size_t>& ins = spec_.nodes[i].inputs;
    for (size_t s = 0; s < ins.size(); ++s) {
      size_t r = ins[s] == NodeSpec::kModelInput ? kInput : root_[ins[s]];
      input_deltas_[i][s] = r == kInput || !needs_gradient_[r] ? nullptr
                            : accumulates_[i][s]               ? scratch_.data()
                                                               : deltas_[r];
    }
    // With several inputs adding into scratch, each must be added before the next is computed:
    // such a node computes them one at a time.
    size_t adding =
        static_cast<size_t>(std::count(accumulates_[i].begin(), accumulates_[i].end(), true));
    std::function<void(size_t)> enqueued;
    if (gradients_enqueued && ranges_[i].count > 0)
      enqueued = [&](size_t k) { gradients_enqueued(first_piece_[i] + k); };
    float* grads = gradients_.data() + ranges_[i].offset;
    const float* params = ranges_[i].count ? parameters_.data() + ranges_[i].offset : nullptr;
    if (adding <= 1) {
      BackwardArgs args{n,      inputs_[i], activations_[i], deltas_[i], input_deltas_[i],
                        params, grads,      group,           pending_[i]};
      args.dx_rounded = writes_dx_rounded_[i];
      args.dy_rounded = reads_dy_rounded_[i];
      // The copy's one reader: c is u's only input and needs nothing but the copy.
      args.dx_rounded_only =
          args.dx_rounded && layers_[dx_rounded_reader_[i]]->reads_only_rounded_dy(backend_, n);
      pending_[i] = nullptr;
      layers_[i]->backward(backend_, args, enqueued);
      for (size_t s = 0; s < ins.size(); ++s) {
        if (!accumulates_[i][s]) continue;
        size_t r = root_[ins[s]];
        if (defers_[i][s]) {
          pending_[r] = scratch_.data();
          continue;
        }
        backend_.add(spec_.nodes[r].out.size() * static_cast<size_t>(n), scratch_.data(),
                     deltas_[r]);
      }
      continue;
    }
    // Several inputs to add: one backward per such input, for layers without parameters only
    // (a second call would rewrite gradients whose all-reduce may have started).
    DT_ENFORCE(ranges_[i].count == 0, "{}: a layer with parameters and inputs that fan out",
               spec_.nodes[i].path);
    std::vector<float*> one(ins.size(), nullptr);
    for (size_t s = 0; s < ins.size(); ++s) {
      if (!accumulates_[i][s] && input_deltas_[i][s] == nullptr) continue;
      std::fill(one.begin(), one.end(), nullptr);
      one[s] = input_deltas_[i][s];
      BackwardArgs args{n, inputs_[i], activations_[i], deltas_[i], one, params, grads, group};
      layers_[i]->backward(backend_, args, enqueued);
      if (accumulates_[i][s]) {
        size_t r = root_[ins[s]];
        backend_.add(spec_.nodes[r].out.size() * static_cast<size_t>(n), scratch_.data(),
                     deltas_[r]);
      }
    }
  }
}

}  // namespace dtrain::nn
