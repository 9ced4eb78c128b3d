"""Privacy flags of launch/train.py and export.py: user-level DP and secure
aggregation (`settings_tree`'s 'privacy' leaf; `privacy.PrivacySettings`
checks them)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('privacy', __name__)
