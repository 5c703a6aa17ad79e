# Copyright 2020 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# Ported to Sluice and modified: tf.data service's own test suite
# (tensorflow/python/data/experimental/kernel_tests/service/) against Sluice's Python API.
"""tf.data service's own tests, ported to Sluice's Python API.

One module per TensorFlow test file; each case names the test it ports. Cases that do not pass
carry a mark whose reason starts with its class: ``missing:`` (an op or feature Sluice does not
have yet; strict xfail), ``bug:`` (a wrong result, class or text; strict xfail), ``not
applicable:`` (TensorFlow internals; skipped) or ``deliberate difference:`` (see docs/tfdata.md;
skipped). ``python -m tfdata_conformance.report`` (from python/tests) prints the table of them.
"""
