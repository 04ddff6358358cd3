// TagMatcher (transport/matching.hpp): what a link that breaks keeps of its early messages.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "chorus/transport/matching.hpp"

namespace unit_test_matching {

namespace {
struct Recv {
  int id = 0;
  chorus::Tag tag = 0;
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

}  // namespace unit_test_matching
