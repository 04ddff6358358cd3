// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A small multi-layer perceptron (Eigen, float32) and SGD with momentum, written to match
// PyTorch one for one:
//   - layers: Linear(sizes[0] -> sizes[1]), ReLU, ..., Linear(-> sizes.back()); loss: softmax
//     cross-entropy averaged over the batch (nn.CrossEntropyLoss);
//   - initialisation: nn.Linear's default, weights and biases uniform in +-1/sqrt(fan_in);
//   - optimiser: torch.optim.SGD(lr, momentum, weight_decay), dampening 0, no Nesterov:
//     d = g + wd * p;  v = momentum * v + d (v = d on the first step);  p -= lr * v.
//
// Parameters live in one flat float vector, gradients in another, both in the order
// W0, b0, W1, b1, ... (W_l is out x in, column-major, like torch's weight transposed in memory:
// the element order differs from torch's state_dict, the maths does not). parameter_tensors()
// and gradient_tensors() give those tensors as spans, in that registration order; backward
// produces them in reverse and reports each one as soon as it is final (for the
// GradientSynchronizer to start its buckets).
//
// Batches are Eigen matrices with one sample per column (in x B).

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlp {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
using Vector = Eigen::Matrix<float, Eigen::Dynamic, 1>;

/// Loss summed over a batch's samples and the number classified correctly.
struct BatchResult {
  double loss_sum = 0;
  std::size_t correct = 0;
};

class Mlp {
 public:
  /// sizes: inputs, hidden layers..., classes; e.g. {784, 256, 128, 10}.
  explicit Mlp(std::vector<int> sizes) : sizes_(std::move(sizes)) {
    if (sizes_.size() < 2) throw std::invalid_argument("Mlp: needs at least an input and an output size");
    for (int s : sizes_)
      if (s < 1) throw std::invalid_argument("Mlp: layer size " + std::to_string(s) + " must be positive");
    std::size_t off = 0;
    for (int l = 0; l < layers(); ++l) {
      w_off_.push_back(off);
      off += std::size_t(out(l)) * std::size_t(in(l));
      b_off_.push_back(off);
      off += std::size_t(out(l));
    }
    params_.assign(off, 0.0f);
    grads_.assign(off, 0.0f);
    z_.resize(std::size_t(layers()));
    a_.resize(std::size_t(layers()));
  }

  int layers() const { return int(sizes_.size()) - 1; }
  int in(int l) const { return sizes_[std::size_t(l)]; }
  int out(int l) const { return sizes_[std::size_t(l) + 1]; }
  const std::vector<int>& sizes() const { return sizes_; }

  /// nn.Linear's default initialisation, from a seed (the same seed gives the same weights).
  void init(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    auto uniform = [&](float bound) {  // [-bound, bound), 24 random bits, platform-independent
      const float u = float(gen() >> 40) * (1.0f / 16777216.0f);
      return (2.0f * u - 1.0f) * bound;
    };
    for (int l = 0; l < layers(); ++l) {
      const float bound = 1.0f / std::sqrt(float(in(l)));
      for (auto& w : weight_span(params_, l)) w = uniform(bound);
      for (auto& b : bias_span(params_, l)) b = uniform(bound);
    }
  }

  std::span<float> parameters() { return params_; }
  std::span<float> gradients() { return grads_; }
  /// W0, b0, W1, b1, ...: registration order. Tensor 2l is W_l, 2l+1 is b_l.
  std::vector<std::span<float>> parameter_tensors() { return tensors(params_); }
  std::vector<std::span<float>> gradient_tensors() { return tensors(grads_); }

  /// Forward and backward on a batch (x: in(0) x B, labels: B values in [0, classes)). Writes
  /// the gradient of the mean loss into gradients(), last layer first, calling
  /// on_ready(tensor index) for each tensor as soon as its gradient is final.
  template <class OnReady>
  BatchResult forward_backward(const Matrix& x, std::span<const std::uint8_t> labels, OnReady&& on_ready) {
    const BatchResult r = forward(x, labels, /*keep_probabilities=*/true);
    const auto batch = static_cast<float>(x.cols());
    // d(mean loss)/d(logits) = (softmax - onehot) / B
    Matrix& dz = probs_;
    for (Eigen::Index j = 0; j < x.cols(); ++j) dz(labels[std::size_t(j)], j) -= 1.0f;
    dz *= 1.0f / batch;
    for (int l = layers() - 1; l >= 0; --l) {
      const Matrix& a_in = (l == 0) ? x : a_[std::size_t(l)];
      auto gw = weight(grads_, l);
      auto gb = bias(grads_, l);
      gw.noalias() = dz * a_in.transpose();
      gb = dz.rowwise().sum();
      on_ready(std::size_t(2 * l + 1));
      on_ready(std::size_t(2 * l));
      if (l > 0) {
        da_.noalias() = weight(params_, l).transpose() * dz;
        dz = da_.cwiseProduct((z_[std::size_t(l - 1)].array() > 0.0f).cast<float>().matrix());
      }
    }
    return r;
  }
  BatchResult forward_backward(const Matrix& x, std::span<const std::uint8_t> labels) {
    return forward_backward(x, labels, [](std::size_t) {});
  }

  /// Loss sum and correct count on a batch, without gradients.
  BatchResult evaluate(const Matrix& x, std::span<const std::uint8_t> labels) {
    return forward(x, labels, /*keep_probabilities=*/false);
  }

 private:
  using Map = Eigen::Map<Matrix>;
  using VMap = Eigen::Map<Vector>;

  std::span<float> weight_span(std::vector<float>& v, int l) {
    return {v.data() + w_off_[std::size_t(l)], std::size_t(out(l)) * std::size_t(in(l))};
  }
  std::span<float> bias_span(std::vector<float>& v, int l) { return {v.data() + b_off_[std::size_t(l)], std::size_t(out(l))}; }
  Map weight(std::vector<float>& v, int l) { return Map(v.data() + w_off_[std::size_t(l)], out(l), in(l)); }
  VMap bias(std::vector<float>& v, int l) { return VMap(v.data() + b_off_[std::size_t(l)], out(l)); }
  std::vector<std::span<float>> tensors(std::vector<float>& v) {
    std::vector<std::span<float>> t;
    for (int l = 0; l < layers(); ++l) {
      t.push_back(weight_span(v, l));
      t.push_back(bias_span(v, l));
    }
    return t;
  }

  BatchResult forward(const Matrix& x, std::span<const std::uint8_t> labels, bool keep_probabilities) {
    if (x.rows() != in(0)) throw std::invalid_argument("Mlp: input has " + std::to_string(x.rows()) + " rows, expected " + std::to_string(in(0)));
    if (std::size_t(x.cols()) != labels.size()) throw std::invalid_argument("Mlp: batch and label counts differ");
    for (int l = 0; l < layers(); ++l) {
      const Matrix& a_in = (l == 0) ? x : a_[std::size_t(l)];
      Matrix& z = z_[std::size_t(l)];
      z.noalias() = weight(params_, l) * a_in;
      z.colwise() += bias(params_, l);
      if (l + 1 < layers()) a_[std::size_t(l + 1)] = z.cwiseMax(0.0f);
    }
    // Softmax cross-entropy, stable: loss_j = log(sum exp(z - m)) + m - z_y.
    const Matrix& logits = z_.back();
    BatchResult r;
    probs_.resize(logits.rows(), logits.cols());
    for (Eigen::Index j = 0; j < logits.cols(); ++j) {
      const auto y = labels[std::size_t(j)];
      if (y >= logits.rows()) throw std::invalid_argument("Mlp: label " + std::to_string(y) + " out of range");
      Eigen::Index best = 0;
      const float m = logits.col(j).maxCoeff(&best);
      probs_.col(j) = (logits.col(j).array() - m).exp().matrix();
      const float s = probs_.col(j).sum();
      r.loss_sum += double(std::log(s) + m - logits(y, j));
      r.correct += (best == y) ? 1 : 0;
      if (keep_probabilities) probs_.col(j) /= s;
    }
    return r;
  }

  std::vector<int> sizes_;
  std::vector<std::size_t> w_off_, b_off_;
  std::vector<float> params_, grads_;
  std::vector<Matrix> z_;  ///< pre-activations per layer
  std::vector<Matrix> a_;  ///< inputs per layer (a_[0] unused: the batch itself)
  Matrix probs_, da_;
};

/// torch.optim.SGD with momentum (dampening 0, not Nesterov) and optional weight decay.
class Sgd {
 public:
  Sgd(std::size_t n, float lr, float momentum, float weight_decay = 0.0f)
      : lr_(lr), momentum_(momentum), weight_decay_(weight_decay), velocity_(n, 0.0f) {}

  void step(std::span<float> params, std::span<const float> grads) {
    if (params.size() != velocity_.size() || grads.size() != velocity_.size())
      throw std::invalid_argument("Sgd::step: sizes differ from the optimiser's");
    for (std::size_t i = 0; i < params.size(); ++i) {
      const float d = grads[i] + weight_decay_ * params[i];
      velocity_[i] = momentum_ * velocity_[i] + d;
      params[i] -= lr_ * velocity_[i];
    }
  }

  /// The momentum buffer (torch's momentum_buffer), in parameters() order: the optimiser's state
  /// that a rank joining a running job receives with the weights.
  std::span<float> velocity() { return velocity_; }

 private:
  float lr_, momentum_, weight_decay_;
  std::vector<float> velocity_;
};

}  // namespace mlp
