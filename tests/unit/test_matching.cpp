// SPDX-License-Identifier: BSD-3-Clause
// TagMatcher (transport/matching.hpp): what a link that breaks keeps of its early messages.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "chorus/core/request.hpp"
#include "chorus/transport/matching.hpp"

namespace unit_test_matching {

namespace {
using State = chorus::detail::RequestState;
std::shared_ptr<State> ordinary() {
  return std::make_shared<State>(chorus::ErrorContext{}, std::chrono::milliseconds(1000));
}
struct Recv {
  int id = 0;
  chorus::Tag tag = 0;
  std::shared_ptr<State> req = ordinary();
  int source = 0;  ///< the peer of the link the entry is on
};
/// An early message: large ones (rts) cannot be fetched once the link broke.
struct Arrival {
  std::string name;
  bool large = false;
};
}  // namespace

TEST_CASE("matching: a broken link drops each tag's first large message and everything behind it") {
  chorus::detail::TagMatcher<Recv, Arrival> m;
  m.add_unexpected(1, {"a1", false});
  m.add_unexpected(2, {"b1", false});
  m.add_unexpected(1, {"a2", true});
  m.add_unexpected(1, {"a3", false});
  m.add_unexpected(2, {"b2", false});
  m.add_unexpected(3, {"c1", true});
  m.remove_unexpected_from([](Arrival& a) { return a.large; });
  std::vector<std::string> left;
  for (chorus::Tag t : {1, 2, 3})
    while (m.take_unexpected(t, [&](Arrival& a) { left.push_back(a.name); })) {
    }
  // a3 sat behind a2 on tag 1: a receive would have taken it in a2's place.
  CHECK(left == std::vector<std::string>{"a1", "b1", "b2"});
}

TEST_CASE("matching: each tag keeps arrival order through growth, wrap-around and other tags") {
  // More entries than the initial capacity, added and taken in an interleaving that wraps the
  // circular buffers around, with a second tag mixed in: every take returns the oldest of its tag.
  chorus::detail::TagMatcher<Recv, Arrival> m;
  int next_a = 0, next_b = 0, taken_a = 0, taken_b = 0;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 7 + round % 5; ++i) {
      m.add_unexpected(1, {std::to_string(next_a++), false});
      if (i % 3 == 0) m.add_unexpected(2, {std::to_string(next_b++), false});
    }
    for (int i = 0; i < 5 + round % 3 && taken_a < next_a; ++i) {
      REQUIRE(m.take_unexpected(1, [&](Arrival& a) { CHECK(a.name == std::to_string(taken_a)); }));
      ++taken_a;
    }
    if (round % 2 == 0 && taken_b < next_b) {
      REQUIRE(m.take_unexpected(2, [&](Arrival& a) { CHECK(a.name == std::to_string(taken_b)); }));
      ++taken_b;
    }
  }
  while (m.take_unexpected(1, [&](Arrival& a) { CHECK(a.name == std::to_string(taken_a)); })) ++taken_a;
  while (m.take_unexpected(2, [&](Arrival& a) { CHECK(a.name == std::to_string(taken_b)); })) ++taken_b;
  CHECK(taken_a == next_a);
  CHECK(taken_b == next_b);
  CHECK_FALSE(m.take_unexpected(3, [](Arrival&) {}));
}

TEST_CASE("matching: posted receives match oldest first per tag and drain in posting order") {
  chorus::detail::TagMatcher<Recv, Arrival> m;
  for (int i = 0; i < 20; ++i) m.add_posted(i % 2 == 0 ? 5 : 6, Recv{i, 0});
  // Tag 6 first: its entries sit behind tag 5's, so taking them is not the front-only case.
  for (int i = 1; i < 20; i += 2) {
    auto r = m.take_posted(6);
    REQUIRE(r.has_value());
    CHECK(r->id == i);
    CHECK(r->tag == 6);
  }
  CHECK_FALSE(m.take_posted(6).has_value());
  for (int i = 21; i < 40; i += 2) m.add_posted(6, Recv{i, 0});
  auto r = m.take_posted(5);
  REQUIRE(r.has_value());
  CHECK(r->id == 0);
  std::vector<int> drained;
  m.drain_posted([&](Recv& x) { drained.push_back(x.id); });
  std::vector<int> want;
  for (int i = 2; i < 20; i += 2) want.push_back(i);
  for (int i = 21; i < 40; i += 2) want.push_back(i);
  CHECK(drained == want);
  CHECK_FALSE(m.take_posted(5).has_value());
}

TEST_CASE("matching: remove_unexpected_if keeps the others in order") {
  chorus::detail::TagMatcher<Recv, Arrival> m;
  for (int i = 0; i < 30; ++i) m.add_unexpected(1, {std::to_string(i), i % 3 == 0});
  m.remove_unexpected_if([](Arrival& a) { return a.large; });
  std::vector<std::string> left;
  while (m.take_unexpected(1, [&](Arrival& a) { left.push_back(a.name); })) {
  }
  std::vector<std::string> want;
  for (int i = 0; i < 30; ++i)
    if (i % 3 != 0) want.push_back(std::to_string(i));
  CHECK(left == want);
}

}  // namespace unit_test_matching

namespace unit_test_matching {
TEST_CASE("matching: a receive from any source is taken by one link only; the others drop its entry") {
  chorus::detail::TagMatcher<Recv, Arrival> from1, from2;  // the matchers of the links from ranks 1 and 2
  auto any = ordinary();
  any->set_any_source(2);
  Recv on1{1, 0, any, 1}, on2{1, 0, any, 2};
  CHECK(from1.admit(on1, false));
  CHECK(from2.admit(on2, false));
  from1.add_posted(7, on1);
  from2.add_posted(7, on2);
  from2.add_posted(7, Recv{2, 0, ordinary(), 2});  // an ordinary receive behind it on the link from 2
  CHECK(any->source_open());
  auto got = from2.take_posted(7);  // rank 2's message arrives first
  REQUIRE(got);
  CHECK(got->id == 1);
  CHECK(any->source() == 2);
  CHECK_FALSE(any->source_open());
  auto next1 = from1.take_posted(7);  // rank 1's: the entry is taken already, nothing else waits
  CHECK_FALSE(next1);
  auto next2 = from2.take_posted(7);  // rank 2's next message: the ordinary receive
  REQUIRE(next2);
  CHECK(next2->id == 2);
  // A withdrawn receive (its timeout) is never taken.
  auto late = ordinary();
  late->set_any_source(1);
  Recv w{3, 0, late, 1};
  CHECK(from1.admit(w, false));
  from1.add_posted(8, w);
  CHECK(late->withdraw_source());
  CHECK_FALSE(from1.take_posted(8));
}
}  // namespace unit_test_matching
