"""What a compaction may spend: the profile (window, reserve, shares), the
upstream's prices, the plan's depth and pace, and what an upstream taught
about its window. Plain numbers; nothing here reads a message."""
