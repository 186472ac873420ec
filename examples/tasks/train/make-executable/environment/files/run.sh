#!/bin/sh
echo "ran with $# args"
