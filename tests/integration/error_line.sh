# SPDX-License-Identifier: BSD-3-Clause
# The error line of the fault tests' drivers (sourced by run_fault.sh and run_hosts.sh):
# fault_driver's CHORUS_ERROR and hosts_driver's HOSTS_ERROR lines share the fields
#   ... code=<ErrorCode> peer=P t=<s> wall=<epoch s> ... msg=<what()>
#
#   error_fields <line> <fault, epoch s>   sets err_code, err_msg, err_after (seconds from the
#                                          fault to the error, one decimal) and err_named (the
#                                          rank of the message's first "peer N", or empty)
error_fields() {
  local line=$1 t_fault=$2 wall
  wall=$(sed -n 's/.* wall=\([0-9.]*\) .*/\1/p' <<<"$line")
  err_code=$(sed -n 's/.* code=\([a-z_]*\) .*/\1/p' <<<"$line")
  err_msg=${line#* msg=}
  err_after=$(awk -v a="$wall" -v b="$t_fault" 'BEGIN { printf "%.1f", a - b }')
  err_named=$(grep -o 'peer [0-9]*' <<<"$err_msg" | head -1 | cut -d' ' -f2)
}
