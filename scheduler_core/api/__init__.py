"""What applications call: job registration (``@job``) and enqueue, broker hints, and the policy
a registered job type decides with."""
